%% @doc Counting, listing, waiting, retention and pause: `job_counts/1' exact
%% through every transition, `job_types/0', `job_list/2' pages (also while
%% others write), `job_wait/4', `keep' and the pruner (subscribers get
%% `removed', counts stay exact), `job_pause/1' / `job_resume/1' on one node
%% (two nodes: `couch_workers_jobs_multinode_tests'), and bad input on each.
%% couch_jobs' `check_get_jobs' and `subscribe_wait_multiple', ported.
-module(couch_workers_jobs_listing_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2, wait_job/3, job_state/2]).

listing_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job counts, lists, waits, retention, pause", fun setup/0, fun teardown/1, [
        ?TDEF_FE(counts_through_every_transition),
        ?TDEF_FE(job_types_lists_types_with_jobs),
        ?TDEF_FE(check_get_jobs),
        ?TDEF_FE(list_pages_in_id_order),
        ?TDEF_FE(list_by_state),
        ?TDEF_FE(list_pages_while_others_write, 30),
        ?TDEF_FE(subscribe_wait_multiple),
        ?TDEF_FE(wait_timeout_and_removed),
        ?TDEF_FE(wait_sees_a_state_held_between_close_changes, 120),
        ?TDEF_FE(accept_infinity_waits_for_a_job),
        ?TDEF_FE(keep_prunes_ended_jobs, 30),
        ?TDEF_FE(job_keep_s_is_the_default_keep, 30),
        ?TDEF_FE(pause_holds_acceptors_resume_wakes_them, 30),
        ?TDEF_FE(bad_input_writes_nothing)
    ]).

setup() ->
    T = unique_type("list"),
    #{type => T, worker => register_worker(T, <<"w">>)}.

teardown(#{worker := W}) ->
    ok = couch_workers:worker_unregister(W).

counts(T) ->
    couch_workers:job_counts(T).

zero() ->
    #{scheduled => 0, pending => 0, running => 0, finished => 0, canceled => 0, failed => 0}.

%% ---- tests ---------------------------------------------------------------

counts_through_every_transition(#{type := T, worker := W}) ->
    ?assertEqual(zero(), counts(T)),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"s">>, #{}, #{delay => 60000}),
    ok = couch_workers:job_add_many(T, [{<<"b">>, #{}, #{}}, {<<"c">>, #{}, #{max_attempts => 1}}]),
    ?assertEqual((zero())#{scheduled := 1, pending := 3}, counts(T)),
    {ok, Ja} = couch_workers:job_accept(W, #{}),
    {ok, Jb} = couch_workers:job_accept(W, #{}),
    {ok, Jc} = couch_workers:job_accept(W, #{}),
    ?assertEqual((zero())#{scheduled := 1, running := 3}, counts(T)),
    ok = couch_workers:job_finish(Ja, #{}),
    ok = couch_workers:job_fail(Jc, #{}, #{}),
    ok = couch_workers:job_release(Jb, #{}),
    ?assertEqual((zero())#{scheduled := 1, pending := 1, finished := 1, failed := 1}, counts(T)),
    ok = couch_workers:job_cancel(T, <<"s">>),
    ok = couch_workers:job_cancel(T, <<"b">>),
    ?assertEqual((zero())#{finished := 1, failed := 1, canceled := 2}, counts(T)),
    ok = couch_workers:job_resubmit(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_resubmit(T, <<"c">>, #{}, #{delay => 60000}),
    ?assertEqual((zero())#{scheduled := 1, pending := 1, canceled := 2}, counts(T)),
    {ok, Ja2} = couch_workers:job_accept(W, #{}),
    ?assertEqual((zero())#{scheduled := 1, running := 1, canceled := 2}, counts(T)),
    %% An unregister releases the running job in the same transaction.
    ok = couch_workers:worker_unregister(W),
    ?assertEqual((zero())#{scheduled := 1, pending := 1, canceled := 2}, counts(T)),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Ja2, #{})),
    [ok = couch_workers:job_remove(T, Id) || Id <- [<<"a">>, <<"b">>, <<"c">>, <<"s">>]],
    ?assertEqual(zero(), counts(T)).

job_types_lists_types_with_jobs(#{type := T}) ->
    T2 = <<T/binary, "-other">>,
    ?assertNot(lists:member(T, couch_workers:job_types())),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_add(T2, <<"a">>, #{}, #{}),
    Types = couch_workers:job_types(),
    ?assert(lists:member(T, Types)),
    ?assert(lists:member(T2, Types)),
    ok = couch_workers:job_remove(T2, <<"a">>),
    ?assertNot(lists:member(T2, couch_workers:job_types())),
    ?assert(lists:member(T, couch_workers:job_types())).

%% couch_jobs: get_jobs/get_types list the jobs of each type with their
%% states. Here: job_types/0 and job_list/2.
check_get_jobs(#{type := T, worker := W}) ->
    T2 = <<T/binary, "-2">>,
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_add(T2, <<"j2">>, #{}, #{}),
    {ok, _} = couch_workers:job_accept(W, #{}),
    ?assertMatch({ok, [#{id := <<"j1">>, state := running}], done}, couch_workers:job_list(T, #{})),
    ?assertMatch({ok, [#{id := <<"j2">>, state := pending}], done}, couch_workers:job_list(T2, #{})),
    ?assert(lists:all(fun(X) -> lists:member(X, couch_workers:job_types()) end, [T, T2])),
    ok = couch_workers:job_remove(T2, <<"j2">>).

list_pages_in_id_order(#{type := T}) ->
    Ids = [iolist_to_binary(io_lib:format("j~3..0b", [I])) || I <- lists:seq(1, 25)],
    ok = couch_workers:job_add_many(T, [{Id, #{}, #{}} || Id <- lists:reverse(Ids)]),
    Pages = pages(T, #{limit => 10}),
    ?assertEqual([10, 10, 5], [length(P) || P <- Pages]),
    ?assertEqual(Ids, [Id || P <- Pages, #{id := Id} <- P]),
    %% A full last page may be followed by {ok, [], done}.
    Pages5 = pages(T, #{limit => 5}),
    ?assertEqual(Ids, [Id || P <- Pages5, #{id := Id} <- P]),
    ?assertMatch({ok, [#{id := <<"j001">>, state := pending, info := #{}}], _}, couch_workers:job_list(T, #{limit => 1})),
    ?assertMatch({ok, [], done}, couch_workers:job_list(<<T/binary, "-none">>, #{})).

%% Every page of T under Opts, following Cont to `done'.
pages(T, Opts) ->
    pages(T, Opts, undefined, []).

pages(T, Opts, Cont, Acc) ->
    O = case Cont of
        undefined -> Opts;
        _ -> Opts#{cont => Cont}
    end,
    case couch_workers:job_list(T, O) of
        {ok, [], done} -> lists:reverse(Acc);
        {ok, Page, done} -> lists:reverse([Page | Acc]);
        {ok, Page, Next} -> pages(T, Opts, Next, [Page | Acc])
    end.

list_by_state(#{type := T, worker := W}) ->
    ok = couch_workers:job_add_many(T, [{<<"p", (integer_to_binary(I))/binary>>, #{}, #{}} || I <- lists:seq(1, 6)]),
    ok = couch_workers:job_add(T, <<"s1">>, #{}, #{delay => 60000}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J1, #{}),
    ok = couch_workers:job_fail(J2, #{}, #{retry => false}),
    ok = couch_workers:job_cancel(T, <<"p6">>),
    Ids = fun(Opts) -> [Id || P <- pages(T, Opts), #{id := Id} <- P] end,
    ?assertEqual([<<"p3">>, <<"p4">>, <<"p5">>], Ids(#{states => [pending], limit => 2})),
    ?assertEqual([<<"s1">>], Ids(#{states => [scheduled]})),
    ?assertEqual([<<"p1">>, <<"p2">>, <<"p6">>], Ids(#{states => [finished, canceled, failed], limit => 1})),
    ?assertEqual([<<"p1">>, <<"p3">>, <<"p4">>, <<"p5">>], Ids(#{states => [pending, finished]})),
    ?assertEqual([], Ids(#{states => [running]})),
    [#{state := failed}] = [J || P <- pages(T, #{states => [failed]}), J <- P].

%% Pages while other processes add, change and remove jobs: a job that
%% did not change during the listing is listed exactly once; no id twice.
list_pages_while_others_write(#{type := T, worker := W}) ->
    Stable = [<<"s", (integer_to_binary(I + 1000))/binary>> || I <- lists:seq(1, 300)],
    ok = couch_workers:job_add_many(T, [{Id, #{}, #{}} || Id <- Stable]),
    Self = self(),
    Stop = make_ref(),
    Writer = spawn_link(fun() -> churn(T, W, 0, Stop, Self) end),
    Listed = [Id || P <- pages(T, #{limit => 7}), #{id := Id} <- P],
    Listed2 = [Id || P <- pages(T, #{states => [pending, running, finished], limit => 9}), #{id := Id} <- P],
    Writer ! Stop,
    receive {churned, N} -> ?assert(N > 0) after 10000 -> error(no_churn) end,
    [
        begin
            ?assertEqual(length(L), length(lists:usort(L))),
            ?assertEqual([], Stable -- L)
        end
     || L <- [Listed, Listed2]
    ].

%% Adds, runs, finishes and removes jobs named c* (they sort before s*)
%% and t* (after), until told to stop.
churn(T, W, N, Stop, Parent) ->
    receive
        Stop -> Parent ! {churned, N}
    after 0 ->
        Id = <<(case N rem 2 of 0 -> <<"c">>; 1 -> <<"t">> end)/binary, (integer_to_binary(N))/binary>>,
        ok = couch_workers:job_add(T, Id, #{}, #{priority => -1}),
        case N rem 3 of
            0 -> ok = couch_workers:job_remove(T, Id);
            _ -> ok
        end,
        churn(T, W, N + 1, Stop, Parent)
    end.

%% couch_jobs: a waiter on several states returns when the job reaches
%% any of them. Here: job_wait/4.
subscribe_wait_multiple(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    %% Already in one of them: at once.
    ?assertMatch({ok, #{state := pending}}, couch_workers:job_wait(T, <<"j">>, [running, pending], 0)),
    Self = self(),
    spawn_link(fun() -> Self ! {waited, couch_workers:job_wait(T, <<"j">>, [finished, failed], infinity)} end),
    timer:sleep(100),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J, #{<<"r">> => 1}),
    receive
        {waited, R} -> ?assertMatch({ok, #{state := finished, result := #{<<"r">> := 1}}}, R)
    after 5000 -> error(no_wait_answer)
    end.

%% A job accepted and finished back to back (its `running' held for
%% microseconds, so its subscription can see one change from `pending'
%% to `finished'): a wait for `running' that began before still answers
%% `{ok, Job}' at once, the job as it is when the waiter learns it passed
%% through `running' (its state says where it went). So does a wait for
%% `pending' on a job that went from `scheduled' through `pending' to a
%% finished run. 20 rounds each: every one answers, none times out.
wait_sees_a_state_held_between_close_changes(#{type := T, worker := W}) ->
    Self = self(),
    Round = fun(I, Wanted, Opts) ->
        Id = integer_to_binary(I),
        ok = couch_workers:job_add(T, Id, #{}, Opts),
        Waiter = spawn_link(fun() -> Self ! {waited, self(), couch_workers:job_wait(T, Id, Wanted, 20000)} end),
        %% The waiter's subscription is in place before the changes.
        couch_workers_test_util:wait_for(fun() -> ets:match(couch_workers_jobs_subs, {'_', Waiter, '_'}) =/= [] end, 10000),
        {ok, J} = couch_workers:job_accept(W, #{timeout => 10000}),
        ok = couch_workers:job_finish(J, #{}),
        receive
            {waited, Waiter, R} ->
                {ok, #{id := Id, state := Got}} = R,
                %% Where it was wanted, or where it went from there.
                ?assert(lists:member(Got, Wanted ++ [running, finished])),
                Got
        after 15000 -> error({no_wait_answer, I, Wanted})
        end
    end,
    Running = [Round(I, [running], #{}) || I <- lists:seq(1, 20)],
    %% (1 s: the waiter must subscribe while the job is still scheduled;
    %% with 50 ms a loaded machine made it due first, and the wait then
    %% answered at once without subscribing.)
    Pending = [Round(I, [pending], #{delay => 1000}) || I <- lists:seq(21, 40)],
    %% (How many rounds the subscription saw as one change, for the record.)
    ?debugFmt("running seen ~p/20, pending seen via a later state ~p/20", [
        length([S || S <- Running, S =:= running]), length([S || S <- Pending, S =/= pending])
    ]).

wait_timeout_and_removed(#{type := T}) ->
    Before = couch_workers_test_util:counts(),
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual({error, timeout}, couch_workers:job_wait(T, <<"j">>, [finished], 200)),
    ?assert(erlang:monotonic_time(millisecond) - T0 >= 200),
    Self = self(),
    spawn_link(fun() -> Self ! {waited, couch_workers:job_wait(T, <<"j">>, [finished], 10000)} end),
    timer:sleep(100),
    ok = couch_workers:job_remove(T, <<"j">>),
    receive {waited, R} -> ?assertEqual({error, not_found}, R) after 5000 -> error(no_wait_answer) end,
    ?assertEqual({error, not_found}, couch_workers:job_wait(T, <<"j">>, [finished], 100)),
    %% Nothing is left of the waits' subscriptions (earlier tests' may
    %% still be ending: at most as many as before).
    Keys = [job_subscriptions, job_watchers],
    ok = couch_workers_test_util:wait_for(
        fun() ->
            Now = couch_workers_test_util:counts(),
            lists:all(fun(K) -> maps:get(K, Now) =< maps:get(K, Before) end, Keys)
        end,
        5000
    ).

accept_infinity_waits_for_a_job(#{type := T, worker := W}) ->
    Self = self(),
    spawn_link(fun() -> Self ! {accepted, couch_workers:job_accept(W, #{timeout => infinity})} end),
    receive {accepted, Early} -> error({accepted_without_a_job, Early}) after 500 -> ok end,
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    receive {accepted, R} -> ?assertMatch({ok, #{id := <<"j">>}}, R) after 5000 -> error(no_accept) end.

keep_prunes_ended_jobs(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"f">>, #{}, #{keep => 1}),
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{keep => 0}),
    ok = couch_workers:job_add(T, <<"x">>, #{}, #{keep => 1, max_attempts => 1}),
    ok = couch_workers:job_add(T, <<"k">>, #{}, #{keep => infinity}),
    {ok, SubF, _} = couch_workers:job_subscribe(T, <<"f">>, self()),
    {ok, Jf} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_cancel(T, <<"c">>),
    {ok, Jx} = couch_workers:job_accept(W, #{}),
    {ok, Jk} = couch_workers:job_accept(W, #{}),
    Ended = os:system_time(millisecond),
    ok = couch_workers:job_finish(Jf, #{}),
    ok = couch_workers:job_fail(Jx, #{}, #{}),
    ok = couch_workers:job_finish(Jk, #{}),
    %% Running jobs are never pruned; ended ones within 5 s of expiry.
    ?assertEqual(removed, wait_job(SubF, fun(R) -> R =:= removed end, 1000 + 5000)),
    ?assert(os:system_time(millisecond) - Ended >= 1000),
    ok = couch_workers_test_util:wait_for(
        fun() -> job_state(T, <<"c">>) =:= not_found andalso job_state(T, <<"x">>) =:= not_found end, 6000
    ),
    ?assertEqual(finished, job_state(T, <<"k">>)),
    ?assertEqual((zero())#{finished := 1}, counts(T)),
    %% A resubmit before the expiry keeps the job.
    ok = couch_workers:job_add(T, <<"r">>, #{}, #{keep => 1}),
    ok = couch_workers:job_cancel(T, <<"r">>),
    ok = couch_workers:job_resubmit(T, <<"r">>, #{}, #{}),
    timer:sleep(2500),
    ?assertEqual(pending, job_state(T, <<"r">>)).

job_keep_s_is_the_default_keep(#{type := T}) ->
    ok = application:set_env(couch_workers, job_keep_s, 0),
    try
        ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
        ?assertMatch({ok, #{keep := 0}}, couch_workers:job_get(T, <<"j">>)),
        ok = couch_workers:job_cancel(T, <<"j">>),
        ok = couch_workers_test_util:wait_for(fun() -> job_state(T, <<"j">>) =:= not_found end, 6000)
    after
        application:unset_env(couch_workers, job_keep_s)
    end,
    ok = couch_workers:job_add(T, <<"k">>, #{}, #{}),
    ?assertMatch({ok, #{keep := infinity}}, couch_workers:job_get(T, <<"k">>)).

pause_holds_acceptors_resume_wakes_them(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    ok = couch_workers:job_pause(T),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 300})),
    Self = self(),
    spawn_link(fun() -> Self ! {accepted, couch_workers:job_accept(W, #{timeout => 20000})} end),
    timer:sleep(300),
    %% Pausing a type pauses only that type.
    T2 = <<T/binary, "-2">>,
    W2 = register_worker(T2, <<"w">>),
    ok = couch_workers:job_add(T2, <<"j">>, #{}, #{}),
    ?assertMatch({ok, _}, couch_workers:job_accept(W2, #{})),
    ok = couch_workers:worker_unregister(W2),
    T0 = erlang:monotonic_time(millisecond),
    ok = couch_workers:job_resume(T),
    receive {accepted, R} -> ?assertMatch({ok, #{id := <<"j">>}}, R) after 20000 -> error(no_accept) end,
    %% Woken by the resume, not at the end of its 20 s wait.
    ?assert(erlang:monotonic_time(millisecond) - T0 < 10000),
    ok = couch_workers:job_resume(T).

bad_input_writes_nothing(#{type := T}) ->
    ?assertError(badarg, couch_workers:job_counts(1)),
    ?assertError(badarg, couch_workers:job_list(t, #{})),
    ?assertError(badarg, couch_workers:job_list(T, [])),
    ?assertError(badarg, couch_workers:job_wait(T, 1, [pending], 10)),
    ?assertError(badarg, couch_workers:job_wait(T, <<"j">>, pending, 10)),
    ?assertError(badarg, couch_workers:job_pause("t")),
    ?assertError(badarg, couch_workers:job_resume(t)),
    ?assertEqual({error, invalid_states}, couch_workers:job_list(T, #{states => []})),
    ?assertEqual({error, invalid_states}, couch_workers:job_list(T, #{states => [done]})),
    ?assertEqual({error, invalid_states}, couch_workers:job_list(T, #{states => pending})),
    ?assertEqual({error, invalid_limit}, couch_workers:job_list(T, #{limit => 0})),
    ?assertEqual({error, invalid_limit}, couch_workers:job_list(T, #{limit => 1001})),
    ?assertEqual({error, invalid_limit}, couch_workers:job_list(T, #{limit => ten})),
    ?assertEqual({error, invalid_cont}, couch_workers:job_list(T, #{cont => <<"j">>})),
    ?assertEqual({error, invalid_states}, couch_workers:job_wait(T, <<"j">>, [], 10)),
    ?assertEqual({error, invalid_states}, couch_workers:job_wait(T, <<"j">>, [gone], 10)),
    ?assertEqual({error, invalid_timeout}, couch_workers:job_wait(T, <<"j">>, [pending], -1)),
    ?assertEqual({error, invalid_timeout}, couch_workers:job_wait(T, <<"j">>, [pending], 1.5)),
    ?assertEqual({error, not_found}, couch_workers:job_wait(T, <<"j">>, [pending], 10)),
    ?assertEqual({error, key_too_large}, couch_workers:job_pause(binary:copy(<<"t">>, 10001))),
    ?assertEqual({error, key_too_large}, couch_workers:job_counts(binary:copy(<<"t">>, 10001))),
    ?assertEqual(zero(), counts(T)),
    ?assertNot(lists:member(T, couch_workers:job_types())).
