%% @doc Leadership of a worker type through the Erlang API: `leader/1'
%% reads the oldest current registration; its owner gets
%% `{couch_workers_leader, Ref, Epoch}' and, when it stops leading,
%% `{couch_workers_leader_lost, Ref, Epoch}'; the next leader's epoch is
%% greater; `if_leader => {WorkerType, Epoch}' on `job_add/4' and
%% `job_resubmit/4' writes only while that epoch leads.
-module(couch_workers_leader_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

-define(WAIT_MS, 10000).

leader_test_() ->
    couch_workers_test_util:app_fixture("couch_workers: leadership", fun setup/0, fun teardown/1, [
        ?TDEF_FE(no_worker_no_leader),
        ?TDEF_FE(oldest_registration_leads_and_its_owner_is_told),
        ?TDEF_FE(unregistered_leader_is_told_and_the_next_leads),
        ?TDEF_FE(owner_exit_hands_leadership_on),
        ?TDEF_FE(if_leader_adds_only_while_its_epoch_leads),
        ?TDEF_FE(if_leader_resubmits_only_while_its_epoch_leads),
        ?TDEF_FE(bad_if_leader_is_refused),
        ?TDEF_FE(readme_example_runs)
    ]).

setup() ->
    #{type => unique_type("ld"), jobs => unique_type("ldjobs")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

no_worker_no_leader(#{type := T}) ->
    ?assertEqual({error, not_found}, couch_workers:leader(T)),
    ?assertError(badarg, couch_workers:leader(not_a_binary)).

oldest_registration_leads_and_its_owner_is_told(#{type := T}) ->
    W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    E1 = recv_leader(W1),
    {Owner2, W2} = owner(T, <<"w2">>),
    ?assertEqual({ok, <<"w1">>, E1}, couch_workers:leader(T)),
    ?assert(is_binary(E1)),
    no_message(Owner2, 300),
    ok = couch_workers:worker_unregister(W1),
    ?assertEqual(E1, recv_lost(W1)),
    ok = stop_owner(Owner2, W2).

unregistered_leader_is_told_and_the_next_leads(#{type := T}) ->
    W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    E1 = recv_leader(W1),
    {Owner2, W2} = owner(T, <<"w2">>),
    ok = couch_workers:worker_unregister(W1),
    ?assertEqual(E1, recv_lost(W1)),
    E2 = owner_leader(Owner2, W2),
    ?assert(E2 > E1),
    ?assertEqual({ok, <<"w2">>, E2}, couch_workers:leader(T)),
    ok = stop_owner(Owner2, W2),
    ?assertEqual({error, not_found}, couch_workers:leader(T)).

owner_exit_hands_leadership_on(#{type := T}) ->
    {Owner1, W1} = owner(T, <<"w1">>),
    E1 = owner_leader(Owner1, W1),
    W2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
    exit(Owner1, kill),
    E2 = recv_leader(W2),
    ?assert(E2 > E1),
    ?assertEqual({ok, <<"w2">>, E2}, couch_workers:leader(T)),
    ok = couch_workers:worker_unregister(W2).

if_leader_adds_only_while_its_epoch_leads(#{type := T, jobs := J}) ->
    W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    E1 = recv_leader(W1),
    {Owner2, W2} = owner(T, <<"w2">>),
    ?assertEqual(ok, couch_workers:job_add(J, <<"a">>, #{}, #{if_leader => {T, E1}})),
    ?assertMatch({ok, #{state := pending}}, couch_workers:job_get(J, <<"a">>)),
    %% Binary keys too, and the job's own answers while the epoch leads.
    ?assertEqual({error, already_exists}, couch_workers:job_add(J, <<"a">>, #{}, #{<<"if_leader">> => {T, E1}})),
    ?assertEqual({error, not_leader}, couch_workers:job_add(J, <<"b">>, #{}, #{if_leader => {T, <<E1/binary, "x">>}})),
    ?assertEqual({error, not_leader}, couch_workers:job_add(J, <<"b">>, #{}, #{if_leader => {<<T/binary, "-other">>, E1}})),
    ?assertEqual({error, not_found}, couch_workers:job_get(J, <<"b">>)),
    ok = couch_workers:worker_unregister(W1),
    E2 = owner_leader(Owner2, W2),
    ?assertEqual({error, not_leader}, couch_workers:job_add(J, <<"c">>, #{}, #{if_leader => {T, E1}, priority => 1})),
    ?assertEqual({error, not_found}, couch_workers:job_get(J, <<"c">>)),
    ?assertEqual(ok, couch_workers:job_add(J, <<"c">>, #{}, #{if_leader => {T, E2}, delay => 60000})),
    ?assertMatch({ok, #{state := scheduled}}, couch_workers:job_get(J, <<"c">>)),
    ok = stop_owner(Owner2, W2).

if_leader_resubmits_only_while_its_epoch_leads(#{type := T, jobs := J}) ->
    W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    E1 = recv_leader(W1),
    ok = couch_workers:job_add(J, <<"r">>, #{<<"n">> => 0}, #{}),
    ?assertEqual(ok, couch_workers:job_resubmit(J, <<"r">>, #{<<"n">> => 1}, #{if_leader => {T, E1}})),
    ?assertMatch({ok, #{info := #{<<"n">> := 1}}}, couch_workers:job_get(J, <<"r">>)),
    ok = couch_workers:worker_unregister(W1),
    ?assertEqual(E1, recv_lost(W1)),
    ?assertEqual({error, not_leader}, couch_workers:job_resubmit(J, <<"r">>, #{<<"n">> => 2}, #{if_leader => {T, E1}})),
    ?assertMatch({ok, #{info := #{<<"n">> := 1}}}, couch_workers:job_get(J, <<"r">>)),
    %% With if_vs as well: both must hold.
    W2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
    E2 = recv_leader(W2),
    {ok, #{vs := VS}} = couch_workers:job_get(J, <<"r">>),
    ?assertEqual({error, changed}, couch_workers:job_resubmit(J, <<"r">>, #{}, #{if_leader => {T, E2}, if_vs => <<0:96>>})),
    ?assertEqual(ok, couch_workers:job_resubmit(J, <<"r">>, #{<<"n">> => 3}, #{if_leader => {T, E2}, if_vs => VS})),
    ?assertMatch({ok, #{info := #{<<"n">> := 3}}}, couch_workers:job_get(J, <<"r">>)),
    ok = couch_workers:worker_unregister(W2).

bad_if_leader_is_refused(#{type := T, jobs := J}) ->
    [
        ?assertEqual({error, invalid_if_leader}, couch_workers:job_add(J, <<"x">>, #{}, #{if_leader => Bad}))
     || Bad <- [T, {T}, {T, 1}, {1, <<"e">>}, {T, <<"e">>, x}]
    ],
    ?assertEqual({error, invalid_if_leader}, couch_workers:job_resubmit(J, <<"x">>, #{}, #{if_leader => T})),
    ?assertEqual({error, not_found}, couch_workers:job_get(J, <<"x">>)).

%% The README's CouchDB-shaped example, line for line: database
%% expiration as a schedule, and a cleanup only the replicator type's
%% leader starts, fenced by `if_leader'.
readme_example_runs(#{}) ->
    ok = couch_workers:schedule_set(<<"db_expiration">>, <<"db_expire">>, #{every => 3600000}, #{}, #{}),
    R = couch_workers:worker_register(<<"replicator">>, <<"n1-r1">>, #{}, self()),
    E = receive {couch_workers_leader, R, Ep} -> Ep after ?WAIT_MS -> error(no_leader) end,
    ok = couch_workers:job_add(<<"repl_cleanup">>, <<"cleanup">>, #{}, #{if_leader => {<<"replicator">>, E}}),
    ?assertMatch([#{id := <<"db_expire">>, next_run_at := N}] when N rem 3600000 =:= 0, couch_workers:schedules(<<"db_expiration">>)),
    ?assertMatch({ok, #{state := pending}}, couch_workers:job_get(<<"repl_cleanup">>, <<"cleanup">>)),
    ok = couch_workers:worker_unregister(R),
    ?assertEqual(E, recv_lost(R)),
    ?assertEqual(
        {error, not_leader},
        couch_workers:job_add(<<"repl_cleanup">>, <<"cleanup2">>, #{}, #{if_leader => {<<"replicator">>, E}})
    ),
    ok = couch_workers:schedule_remove(<<"db_expiration">>, <<"db_expire">>),
    ok = couch_workers:job_remove(<<"repl_cleanup">>, <<"cleanup">>).

%% ---- helpers ---------------------------------------------------------------

recv_leader(Ref) ->
    receive
        {couch_workers_leader, Ref, Epoch} -> Epoch
    after ?WAIT_MS -> error({no_leader_message, Ref})
    end.

recv_lost(Ref) ->
    receive
        {couch_workers_leader_lost, Ref, Epoch} -> Epoch
    after ?WAIT_MS -> error({no_leader_lost_message, Ref})
    end.

%% A process that registers `Id' and forwards its leadership messages.
owner(T, Id) ->
    Self = self(),
    Pid = spawn(fun() ->
        W = couch_workers:worker_register(T, Id, #{}, self()),
        Self ! {registered, self(), W},
        forward(Self)
    end),
    receive
        {registered, Pid, W} -> {Pid, W}
    after ?WAIT_MS -> error(no_registration)
    end.

forward(To) ->
    receive
        {stop, From, W} ->
            From ! {stopped, self(), couch_workers:worker_unregister(W)};
        Msg ->
            To ! {owner, self(), Msg},
            forward(To)
    end.

owner_leader(Pid, W) ->
    receive
        {owner, Pid, {couch_workers_leader, W, Epoch}} -> Epoch
    after ?WAIT_MS -> error({no_leader_message, Pid})
    end.

no_message(Pid, Ms) ->
    receive
        {owner, Pid, Msg} -> error({unexpected, Msg})
    after Ms -> ok
    end.

stop_owner(Pid, W) ->
    Pid ! {stop, self(), W},
    receive
        {stopped, Pid, Answer} -> Answer
    after ?WAIT_MS -> error(no_stop)
    end.
