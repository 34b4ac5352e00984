%% @doc `couch_workers:job_finish_accept/3': a finish and the worker's next
%% accept in one call and one transaction. Queue order, the finish's
%% errors (nothing taken), no next job (`{ok, none}': empty, paused, stale
%% registration), metrics of both halves, and every job taken once by
%% workers that drain a queue with it.
-module(couch_workers_finish_accept_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2, job_state/2]).

finish_accept_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job_finish_accept/3", fun setup/0, fun teardown/1, [
        ?TDEF_FE(finishes_and_takes_the_next_in_order),
        ?TDEF_FE(a_refused_finish_takes_nothing),
        ?TDEF_FE(none_when_paused_or_stale),
        ?TDEF_FE(bad_arguments),
        ?TDEF_FE(counts_a_finish_and_an_accept),
        ?TDEF_FE(four_workers_drain_60_jobs_once, 30)
    ]).

setup() ->
    #{type => unique_type("fa")}.

teardown(#{}) ->
    ok.

finishes_and_takes_the_next_in_order(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{priority => 1}),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{priority => 1}),
    {ok, #{id := <<"a">>} = A} = couch_workers:job_accept(W, #{}),
    {ok, #{id := <<"b">>, state := running, worker := <<"w1">>, token := _} = B} =
        couch_workers:job_finish_accept(A, #{<<"r">> => 1}, W),
    ?assertMatch({ok, #{state := finished, result := #{<<"r">> := 1}}}, couch_workers:job_get(T, <<"a">>)),
    %% The handle is the stored job (its vs complete) plus its token; only
    %% job_get/2 adds the history.
    {ok, StoredB} = couch_workers:job_get(T, <<"b">>),
    ?assertEqual(maps:without([history], StoredB), maps:without([token, queued_at], B)),
    {ok, #{id := <<"c">>} = C} = couch_workers:job_finish_accept(B, #{}, W),
    ?assertEqual({ok, none}, couch_workers:job_finish_accept(C, #{}, W)),
    ?assertEqual(finished, job_state(T, <<"c">>)),
    ?assertMatch(#{finished := 3, running := 0, pending := 0}, couch_workers:job_counts(T)).

a_refused_finish_takes_nothing(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{}),
    {ok, A} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(A, #{}),
    ?assertEqual({error, not_owner}, couch_workers:job_finish_accept(A, #{}, W)),
    ?assertEqual(pending, job_state(T, <<"b">>)),
    {ok, B} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_remove(T, <<"b">>),
    ?assertEqual({error, not_found}, couch_workers:job_finish_accept(B, #{}, W)),
    %% A result JSON cannot hold: nothing written.
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"d">>, #{}, #{}),
    {ok, C} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, invalid_result}, couch_workers:job_finish_accept(C, #{1 => 1}, W)),
    ?assertEqual(running, job_state(T, <<"c">>)),
    ?assertEqual(pending, job_state(T, <<"d">>)).

none_when_paused_or_stale(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    [ok = couch_workers:job_add(T, Id, #{}, #{}) || Id <- [<<"a">>, <<"b">>, <<"c">>]],
    {ok, A} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_pause(T),
    ?assertEqual({ok, none}, couch_workers:job_finish_accept(A, #{}, W)),
    ?assertEqual(finished, job_state(T, <<"a">>)),
    ok = couch_workers:job_resume(T),
    {ok, B} = couch_workers:job_accept(W, #{}),
    %% A registration that ended: the finish alone.
    ok = couch_workers:worker_unregister(W),
    W2 = register_worker(T, <<"w1">>),
    {ok, B2} = couch_workers:job_accept(W2, #{}),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(B, #{})),
    ?assertEqual({ok, none}, couch_workers:job_finish_accept(B2, #{}, W)),
    ?assertEqual(finished, job_state(T, maps:get(id, B2))),
    ?assertEqual(1, couch_workers:job_pending_count(T)).

bad_arguments(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    {ok, A} = couch_workers:job_accept(W, #{}),
    ?assertError(badarg, couch_workers:job_finish_accept(maps:remove(token, A), #{}, W)),
    ?assertError(badarg, couch_workers:job_finish_accept(A, not_a_map, W)),
    ?assertError(badarg, couch_workers:job_finish_accept(A, #{}, not_a_ref)),
    %% At the NIF: only a registration resource names the worker (an id,
    %% which job_accept takes, or a reference is badarg), and the handle
    %% and result keep their shapes.
    {ok, T, <<"w1">>, Reg} = couch_workers_local:registration(W),
    Nif = fun(Handle, Result, Worker) -> couch_workers_nif:job_finish_accept(make_ref(), Handle, Result, Worker) end,
    ?assertError(badarg, Nif(A, #{}, <<"w1">>)),
    ?assertError(badarg, Nif(A, #{}, W)),
    ?assertError(badarg, Nif(maps:remove(token, A), #{}, Reg)),
    ?assertError(badarg, Nif(A, not_a_map, Reg)),
    ?assertError(badarg, couch_workers_nif:job_finish_accept(not_a_ref, A, #{}, Reg)),
    ?assertEqual(running, job_state(T, <<"a">>)).

counts_a_finish_and_an_accept(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{}),
    {ok, A} = couch_workers:job_accept(W, #{}),
    ?assertMatch(#{jobs_finished := 0, jobs_accepted := 1}, counters(T)),
    {ok, B} = couch_workers:job_finish_accept(A, #{}, W),
    ?assertMatch(#{jobs_finished := 1, jobs_accepted := 2}, counters(T)),
    {ok, none} = couch_workers:job_finish_accept(B, #{}, W),
    ?assertMatch(#{jobs_finished := 2, jobs_accepted := 2}, counters(T)).

%% The type's counters, absent ones 0.
counters(T) ->
    M = maps:get(T, maps:get(types, couch_workers:metrics()), #{}),
    maps:from_list([{K, maps:get(K, M, 0)} || K <- [jobs_finished, jobs_accepted]]).

four_workers_drain_60_jobs_once(#{type := T}) ->
    N = 60,
    ok = couch_workers:job_add_many(T, [{integer_to_binary(I), #{}, #{}} || I <- lists:seq(1, N)]),
    Self = self(),
    Pids = [
        spawn_link(fun() ->
            W = register_worker(T, <<"w", (integer_to_binary(K))/binary>>),
            Self ! {done, self(), drain(W, couch_workers:job_accept(W, #{}), [])}
        end)
     || K <- lists:seq(1, 4)
    ],
    Ids = lists:append([receive {done, P, Done} -> Done after 20000 -> error(drain_timeout) end || P <- Pids]),
    ?assertEqual(N, length(Ids)),
    ?assertEqual(N, length(lists:usort(Ids))),
    ?assertMatch(#{finished := N, running := 0, pending := 0}, couch_workers:job_counts(T)).

drain(W, {ok, #{id := Id} = Job}, Done) ->
    case couch_workers:job_finish_accept(Job, #{}, W) of
        {ok, none} -> [Id | Done];
        {ok, Next} -> drain(W, {ok, Next}, [Id | Done])
    end;
drain(_W, {error, not_found}, Done) ->
    Done.
