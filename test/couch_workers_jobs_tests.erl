%% @doc The job queue: add/remove/get, accept and finish, blocking accept,
%% update, order, concurrent workers, cancel, counts, add_many, removal of
%% a running job, failover of an inactive job (unregister, pid exit) and
%% the fencing of old handles. couch_jobs' EUnit behaviours, ported.
-module(couch_workers_jobs_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [
    unique_type/1,
    wait_for/2,
    settled_stats/1,
    register_worker/2,
    job_state/2
]).

-define(I64_MIN, -9223372036854775808).
-define(I64_MAX, 9223372036854775807).

jobs_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job queue", fun setup/0, fun teardown/1, [
        ?TDEF_FE(add_remove_get),
        ?TDEF_FE(add_existing_id_in_any_state),
        ?TDEF_FE(basic_accept_and_finish),
        ?TDEF_FE(accept_without_job_or_worker_is_not_found),
        ?TDEF_FE(accept_blocking),
        ?TDEF_FE(accept_timeout_expires, 30),
        ?TDEF_FE(job_processor_update),
        ?TDEF_FE(priority_and_fifo_order),
        ?TDEF_FE(add_many_keeps_its_order),
        ?TDEF_FE(five_workers_take_25_jobs_once, 30),
        ?TDEF_FE(cancel_pending_job),
        ?TDEF_FE(cancel_running_job),
        ?TDEF_FE(cancel_running_then_finish),
        ?TDEF_FE(cancel_done_job_changes_nothing),
        ?TDEF_FE(pending_count_is_exact),
        ?TDEF_FE(add_many_all_or_nothing),
        ?TDEF_FE(remove_running_job),
        ?TDEF_FE(unregister_sends_job_back_to_pending),
        ?TDEF_FE(pid_exit_sends_job_back_to_pending),
        ?TDEF_FE(handle_of_other_accept_is_refused),
        ?TDEF_FE(dead_acceptor_takes_no_job),
        ?TDEF_FE(abandoned_accept_takes_no_job),
        ?TDEF_FE(waiters_and_dispatchers_do_not_leak)
    ]).

setup() ->
    #{type => unique_type("jt")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

add_remove_get(#{type := T}) ->
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual(ok, couch_workers:job_add(T, <<"j1">>, #{}, #{})),
    {ok, Job} = couch_workers:job_get(T, <<"j1">>),
    ?assertMatch(
        #{
            type := T,
            id := <<"j1">>,
            state := pending,
            worker := null,
            priority := 0,
            info := #{},
            result := null,
            attempts := 0,
            cancel_requested := false
        },
        Job
    ),
    #{vs := VS} = Job,
    ?assert(is_binary(VS)),
    %% A job map from get is not a handle.
    ?assertNot(maps:is_key(token, Job)),
    ?assertEqual(ok, couch_workers:job_remove(T, <<"j1">>)),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual({error, not_found}, couch_workers:job_remove(T, <<"j1">>)),
    %% Info comes back with binary keys; any binary id works; the
    %% priority may come under a binary key too.
    Id = <<0, 255, "j2">>,
    Info = #{x => 42, <<"nested">> => #{deep => [1, <<"s">>, null, true]}},
    ?assertEqual(ok, couch_workers:job_add(T, Id, Info, #{<<"priority">> => 7})),
    ?assertMatch(
        {ok, #{
            id := Id,
            priority := 7,
            info := #{<<"x">> := 42, <<"nested">> := #{<<"deep">> := [1, <<"s">>, null, true]}}
        }},
        couch_workers:job_get(T, Id)
    ),
    ?assertEqual(ok, couch_workers:job_remove(T, Id)).

add_existing_id_in_any_state(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"v">> => 1}, #{}),
    %% Pending: refused, and the first info stands.
    ?assertEqual({error, already_exists}, couch_workers:job_add(T, <<"j1">>, #{<<"v">> => 2}, #{})),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, already_exists}, couch_workers:job_add(T, <<"j1">>, #{}, #{})),
    ok = couch_workers:job_finish(Job, #{}),
    ?assertEqual({error, already_exists}, couch_workers:job_add(T, <<"j1">>, #{}, #{})),
    ?assertMatch({ok, #{state := finished, info := #{<<"v">> := 1}}}, couch_workers:job_get(T, <<"j1">>)),
    %% The same id in another type is another job.
    T2 = <<T/binary, "_2">>,
    ?assertEqual(ok, couch_workers:job_add(T2, <<"j1">>, #{}, #{})),
    %% Removed, the id can be reused.
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(ok, couch_workers:job_add(T, <<"j1">>, #{<<"v">> => 3}, #{})),
    ?assertMatch({ok, #{state := pending, attempts := 0, info := #{<<"v">> := 3}}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:worker_unregister(W).

basic_accept_and_finish(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"a">> => 1}, #{priority => 3}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ?assertMatch(
        #{
            type := T,
            id := <<"j1">>,
            state := running,
            worker := <<"w1">>,
            priority := 3,
            info := #{<<"a">> := 1},
            result := null,
            attempts := 1,
            token := <<_:16/binary>>
        },
        Job
    ),
    {ok, Got} = couch_workers:job_get(T, <<"j1">>),
    ?assertMatch(#{state := running, worker := <<"w1">>, attempts := 1}, Got),
    %% The handle is the job, its token and (an accept's) queued_at; only
    %% job_get/2 adds the history.
    ?assertMatch(#{queued_at := At} when is_integer(At), Job),
    ?assertEqual(maps:without([token, queued_at], Job), maps:without([history], Got)),
    %% A result JSON cannot hold: refused, nothing changes.
    ?assertEqual({error, invalid_result}, couch_workers:job_finish(Job, #{1 => 1})),
    ?assertEqual(running, job_state(T, <<"j1">>)),
    Result = #{<<"x">> => 42},
    ?assertEqual(ok, couch_workers:job_finish(Job, Result)),
    {ok, Done} = couch_workers:job_get(T, <<"j1">>),
    ?assertMatch(#{state := finished, result := Result, worker := null, attempts := 1}, Done),
    ?assert(maps:get(vs, Done) > maps:get(vs, Got)),
    %% The handle is spent.
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_update(Job, #{})),
    ok = couch_workers:worker_unregister(W).

accept_without_job_or_worker_is_not_found(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 0})),
    %% A job of another type is not for this worker.
    ok = couch_workers:job_add(<<T/binary, "_other">>, <<"j1">>, #{}, #{}),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    %% Unknown and stale worker refs.
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual({error, not_found}, couch_workers:job_accept(make_ref(), #{})),
    ok = couch_workers:worker_unregister(W),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 200})),
    ?assertEqual(pending, job_state(T, <<"j1">>)).

accept_blocking(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    Accept = fun() -> exit(couch_workers:job_accept(W, #{timeout => 10000})) end,
    WaitAccept = fun(Ref) ->
        receive
            {'DOWN', Ref, _, _, Res} -> Res
        after 500 -> timeout
        end
    end,
    {_, Ref1} = spawn_monitor(Accept),
    %% Added by this process while the other one waits: pushed to it.
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertMatch({ok, #{id := <<"j1">>, state := running}}, WaitAccept(Ref1)),
    {_, Ref2} = spawn_monitor(Accept),
    ?assertEqual(timeout, WaitAccept(Ref2)),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    ?assertMatch({ok, #{id := <<"j2">>}}, WaitAccept(Ref2)),
    ok = couch_workers:worker_unregister(W).

accept_timeout_expires(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 300})),
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    ?assert(Elapsed >= 300),
    %% Answered at the timeout, with room for a loaded machine (a wait
    %% that ignored it would not answer at all).
    ?assert(Elapsed < 10000),
    %% A job added after the wait ended stays pending.
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    timer:sleep(100),
    ?assertEqual(pending, job_state(T, <<"j1">>)),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    ok = couch_workers:worker_unregister(W).

job_processor_update(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"x">> => 0}, #{}),
    {ok, Job0} = couch_workers:job_accept(W, #{}),
    {ok, Job1} = couch_workers:job_update(Job0, #{<<"x">> => 1}),
    ?assertMatch(#{state := running, info := #{<<"x">> := 1}}, Job1),
    %% Same accept, same token; a later version.
    ?assertEqual(maps:get(token, Job0), maps:get(token, Job1)),
    ?assert(maps:get(vs, Job1) > maps:get(vs, Job0)),
    ?assertMatch({ok, #{state := running, info := #{<<"x">> := 1}}}, couch_workers:job_get(T, <<"j1">>)),
    %% Info is replaced, not merged; either handle of this accept works.
    {ok, Job2} = couch_workers:job_update(Job0, #{<<"y">> => 2}),
    ?assertEqual(#{<<"y">> => 2}, maps:get(info, Job2)),
    %% Info JSON cannot hold: refused, nothing changes.
    ?assertEqual({error, invalid_info}, couch_workers:job_update(Job2, #{1 => 1})),
    ?assertEqual({error, invalid_info}, couch_workers:job_update(Job2, #{p => self()})),
    ?assertMatch({ok, #{info := #{<<"y">> := 2}}}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual(ok, couch_workers:job_finish(Job2, #{<<"z">> => 3})),
    ?assertMatch(
        {ok, #{state := finished, info := #{<<"y">> := 2}, result := #{<<"z">> := 3}}},
        couch_workers:job_get(T, <<"j1">>)
    ),
    ok = couch_workers:worker_unregister(W).

priority_and_fifo_order(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    Jobs = [
        {<<"a">>, 5},
        {<<"b">>, 0},
        {<<"c">>, 5},
        {<<"d">>, -3},
        {<<"e">>, 0},
        {<<"f">>, ?I64_MIN},
        {<<"g">>, ?I64_MAX},
        {<<"h">>, -3},
        {<<"i">>, 0}
    ],
    [ok = couch_workers:job_add(T, Id, #{}, #{priority => P}) || {Id, P} <- Jobs],
    Taken = accept_all(W, []),
    ?assertEqual([<<"f">>, <<"d">>, <<"h">>, <<"b">>, <<"e">>, <<"i">>, <<"a">>, <<"c">>, <<"g">>], Taken),
    ok = couch_workers:worker_unregister(W).

add_many_keeps_its_order(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"first">>, #{}, #{}),
    Ids = [integer_to_binary(I) || I <- lists:seq(1, 20)],
    ok = couch_workers:job_add_many(T, [{Id, #{}, #{}} || Id <- Ids]),
    ok = couch_workers:job_add(T, <<"last">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"urgent">>, #{}, #{priority => -1}),
    ?assertEqual([<<"urgent">>, <<"first">>] ++ Ids ++ [<<"last">>], accept_all(W, [])),
    ok = couch_workers:worker_unregister(W).

five_workers_take_25_jobs_once(#{type := T}) ->
    Self = self(),
    %% Workers wait before any job exists, so that jobs are pushed to
    %% waiting acceptors as well as taken at once.
    Pids = [
        spawn_link(fun() ->
            W = register_worker(T, <<"w", (integer_to_binary(N))/binary>>),
            Self ! {ready, self()},
            Self ! {done, self(), work(W, [])}
        end)
     || N <- lists:seq(1, 5)
    ],
    [
        receive
            {ready, P} -> ok
        end
     || P <- Pids
    ],
    Ids = [<<"job", (integer_to_binary(I))/binary>> || I <- lists:seq(1, 25)],
    {Singles, Batch} = lists:split(10, Ids),
    [ok = couch_workers:job_add(T, Id, #{}, #{}) || Id <- Singles],
    ok = couch_workers:job_add_many(T, [{Id, #{}, #{}} || Id <- Batch]),
    PerWorker = [
        receive
            {done, P, Taken} -> Taken
        after 20000 -> error({worker_timeout, P})
        end
     || P <- Pids
    ],
    All = lists:append(PerWorker),
    %% Each job taken exactly once, by one worker, and finished.
    ?assertEqual(25, length(All)),
    ?assertEqual(lists:sort(Ids), lists:sort(All)),
    [?assertMatch({ok, #{state := finished, attempts := 1}}, couch_workers:job_get(T, Id)) || Id <- Ids],
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    io:format(standard_error, "~n    jobs per worker: ~w~n", [[length(P) || P <- PerWorker]]).

cancel_pending_job(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    ?assertEqual(ok, couch_workers:job_cancel(T, <<"j1">>)),
    ?assertMatch({ok, #{state := canceled, worker := null, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    %% Never accepted, also not by a waiting acceptor.
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 200})),
    ?assertEqual(ok, couch_workers:job_cancel(T, <<"j1">>)),
    ?assertEqual({error, not_found}, couch_workers:job_cancel(T, <<"nope">>)),
    ok = couch_workers:worker_unregister(W).

cancel_running_job(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"v">> => 1}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ?assertEqual(ok, couch_workers:job_cancel(T, <<"j1">>)),
    %% Still running: a request, which the worker sees at its next update.
    ?assertMatch(
        {ok, #{state := running, worker := <<"w1">>, cancel_requested := true}},
        couch_workers:job_get(T, <<"j1">>)
    ),
    ?assertEqual(ok, couch_workers:job_cancel(T, <<"j1">>)),
    ?assertEqual({error, canceled}, couch_workers:job_update(Job, #{<<"v">> => 2})),
    {ok, Canceled} = couch_workers:job_get(T, <<"j1">>),
    ?assertMatch(#{state := canceled, worker := null, info := #{<<"v">> := 1}}, Canceled),
    %% No longer the worker's.
    ?assertEqual({error, not_owner}, couch_workers:job_update(Job, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    ok = couch_workers:worker_unregister(W).

cancel_running_then_finish(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_cancel(T, <<"j1">>),
    %% A finish before the next update still finishes it.
    ?assertEqual(ok, couch_workers:job_finish(Job, #{<<"r">> => 1})),
    ?assertMatch(
        {ok, #{state := finished, result := #{<<"r">> := 1}, cancel_requested := false}},
        couch_workers:job_get(T, <<"j1">>)
    ),
    ok = couch_workers:worker_unregister(W).

cancel_done_job_changes_nothing(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(Job, #{}),
    {ok, Before} = couch_workers:job_get(T, <<"j1">>),
    ?assertEqual(ok, couch_workers:job_cancel(T, <<"j1">>)),
    ?assertEqual({ok, Before}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    ok = couch_workers:job_cancel(T, <<"j2">>),
    {ok, Canceled} = couch_workers:job_get(T, <<"j2">>),
    ?assertEqual(ok, couch_workers:job_cancel(T, <<"j2">>)),
    ?assertEqual({ok, Canceled}, couch_workers:job_get(T, <<"j2">>)),
    ok = couch_workers:worker_unregister(W).

pending_count_is_exact(#{type := T}) ->
    C = fun() -> couch_workers:job_pending_count(T) end,
    ?assertEqual(0, C()),
    W = register_worker(T, <<"w1">>),
    [ok = couch_workers:job_add(T, <<"j", (integer_to_binary(I))/binary>>, #{}, #{}) || I <- lists:seq(1, 3)],
    ?assertEqual(3, C()),
    ok = couch_workers:job_add_many(T, [{<<"m1">>, #{}, #{}}, {<<"m2">>, #{}, #{priority => -1}}]),
    ?assertEqual(5, C()),
    %% Refused adds count nothing.
    {error, already_exists} = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {error, {already_exists, _}} = couch_workers:job_add_many(T, [{<<"j2">>, #{}, #{}}, {<<"new">>, #{}, #{}}]),
    ?assertEqual(5, C()),
    {ok, #{id := <<"m2">>} = J1} = couch_workers:job_accept(W, #{}),
    ?assertEqual(4, C()),
    {ok, #{id := <<"j1">>} = J2} = couch_workers:job_accept(W, #{}),
    ?assertEqual(3, C()),
    ok = couch_workers:job_cancel(T, <<"j2">>),
    ?assertEqual(2, C()),
    ok = couch_workers:job_remove(T, <<"j3">>),
    ?assertEqual(1, C()),
    %% Canceling a running job leaves the count alone...
    ok = couch_workers:job_cancel(T, <<"j1">>),
    ?assertEqual(1, C()),
    {error, canceled} = couch_workers:job_update(J2, #{}),
    ?assertEqual(1, C()),
    %% ...finishing too; failover adds its jobs back.
    {ok, #{id := <<"m1">>}} = couch_workers:job_accept(W, #{}),
    ?assertEqual(0, C()),
    ok = couch_workers:job_finish(J1, #{}),
    ?assertEqual(0, C()),
    ok = couch_workers:worker_unregister(W),
    ?assertEqual(1, C()),
    ok = couch_workers:job_remove(T, <<"m1">>),
    ?assertEqual(0, C()),
    %% Removing jobs in other states leaves it alone.
    [ok = couch_workers:job_remove(T, Id) || Id <- [<<"j1">>, <<"j2">>, <<"m2">>]],
    ?assertEqual(0, C()),
    ?assertEqual(0, couch_workers:job_pending_count(<<T/binary, "_none">>)).

add_many_all_or_nothing(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual(
        {error, {already_exists, [<<"j1">>, <<"j2">>]}},
        couch_workers:job_add_many(T, [
            {<<"j0">>, #{}, #{}},
            {<<"j1">>, #{}, #{}},
            {<<"j2">>, #{}, #{}},
            {<<"j2">>, #{}, #{}}
        ])
    ),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j0">>)),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j2">>)),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    %% One bad info anywhere: nothing added.
    ?assertEqual(
        {error, invalid_info},
        couch_workers:job_add_many(T, [{<<"j3">>, #{}, #{}}, {<<"j4">>, #{t => {1}}, #{}}])
    ),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j3">>)),
    ?assertEqual(ok, couch_workers:job_add_many(T, [])),
    ?assertEqual(
        ok,
        couch_workers:job_add_many(T, [
            {<<"j2">>, #{<<"n">> => 2}, #{priority => 9}},
            {<<"j3">>, #{<<"n">> => 3}, #{}}
        ])
    ),
    ?assertMatch({ok, #{state := pending, priority := 9, info := #{<<"n">> := 2}}}, couch_workers:job_get(T, <<"j2">>)),
    ?assertMatch({ok, #{state := pending, priority := 0, info := #{<<"n">> := 3}}}, couch_workers:job_get(T, <<"j3">>)),
    ?assertEqual(3, couch_workers:job_pending_count(T)).

remove_running_job(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ?assertEqual(ok, couch_workers:job_remove(T, <<"j1">>)),
    ?assertEqual({error, not_found}, couch_workers:job_remove(T, <<"j1">>)),
    ?assertEqual({error, not_found}, couch_workers:job_update(Job, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_finish(Job, #{})),
    %% Re-added under the same id, the old handle is still refused.
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job2} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, not_owner}, couch_workers:job_update(Job, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    ?assertEqual(ok, couch_workers:job_finish(Job2, #{})),
    ok = couch_workers:worker_unregister(W).

unregister_sends_job_back_to_pending(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"y">> => 1}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:worker_unregister(W),
    %% In the same transaction as the removal: at once.
    ?assertMatch(
        {ok, #{state := pending, worker := null, attempts := 1, info := #{<<"y">> := 1}}},
        couch_workers:job_get(T, <<"j1">>)
    ),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    %% The old handle is refused...
    ?assertEqual({error, not_owner}, couch_workers:job_update(Job, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    %% ...also once the same worker took the job again.
    W2 = register_worker(T, <<"w1">>),
    {ok, Job2} = couch_workers:job_accept(W2, #{}),
    ?assertMatch(#{id := <<"j1">>, worker := <<"w1">>, attempts := 2}, Job2),
    ?assertNotEqual(maps:get(token, Job), maps:get(token, Job2)),
    ?assertEqual({error, not_owner}, couch_workers:job_update(Job, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    ?assertMatch({ok, _}, couch_workers:job_update(Job2, #{<<"y">> => 2})),
    ?assertEqual(ok, couch_workers:job_finish(Job2, #{})),
    ok = couch_workers:worker_unregister(W2).

pid_exit_sends_job_back_to_pending(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Self = self(),
    {Pid, Mon} = spawn_monitor(fun() ->
        W = register_worker(T, <<"w1">>),
        {ok, Job} = couch_workers:job_accept(W, #{}),
        Self ! {job, Job},
        receive
            stop -> ok
        end
    end),
    Job =
        receive
            {job, J} -> J
        after 5000 -> error(no_job)
        end,
    ?assertEqual(running, job_state(T, <<"j1">>)),
    exit(Pid, kill),
    receive
        {'DOWN', Mon, process, Pid, _} -> ok
    end,
    wait_for(fun() -> job_state(T, <<"j1">>) =:= pending end, 5000),
    ?assertMatch({ok, #{attempts := 1, worker := null}}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual({error, not_owner}, couch_workers:job_update(Job, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    W2 = register_worker(T, <<"w1">>),
    {ok, Job2} = couch_workers:job_accept(W2, #{}),
    ?assertMatch(#{attempts := 2}, Job2),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    ok = couch_workers:job_finish(Job2, #{}),
    ok = couch_workers:worker_unregister(W2).

handle_of_other_accept_is_refused(#{type := T}) ->
    W1 = register_worker(T, <<"w1">>),
    W2 = register_worker(T, <<"w2">>),
    ok = couch_workers:job_add_many(T, [{<<"j1">>, #{}, #{}}, {<<"j2">>, #{}, #{}}]),
    {ok, Job1} = couch_workers:job_accept(W1, #{}),
    {ok, Job2} = couch_workers:job_accept(W2, #{}),
    %% A forged token, another worker's name, another job's token.
    Forged = Job1#{token := <<0:128>>},
    ?assertEqual({error, not_owner}, couch_workers:job_update(Forged, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Forged, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job1#{worker := <<"w2">>}, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job1#{token := maps:get(token, Job2)}, #{})),
    ?assertEqual(running, job_state(T, <<"j1">>)),
    %% A handle map is only its fence: other fields do not matter.
    ?assertMatch({ok, _}, couch_workers:job_update(Job1#{info := #{}, state := finished}, #{<<"k">> => 1})),
    ?assertEqual(ok, couch_workers:job_finish(Job1, #{})),
    ?assertEqual(ok, couch_workers:job_finish(Job2, #{})),
    ok = couch_workers:worker_unregister(W1),
    ok = couch_workers:worker_unregister(W2).

dead_acceptor_takes_no_job(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    {Pid, Mon} = spawn_monitor(fun() -> couch_workers:job_accept(W, #{timeout => 60000}) end),
    wait_for(fun() -> maps:get(job_waiters, couch_workers:stats()) =:= 1 end, 5000),
    exit(Pid, kill),
    receive
        {'DOWN', Mon, process, Pid, killed} -> ok
    end,
    %% Its waiter handle was freed with its heap: the dispatcher drops it
    %% (and then stops), long before the 60 s timeout.
    settled_stats(#{job_waiters => 0, accept_waiters => 0, job_dispatchers => 0}),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    timer:sleep(200),
    ?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:worker_unregister(W).

abandoned_accept_takes_no_job(#{type := T}) ->
    %% What job_accept/2 does when no answer came in its (very long)
    %% safety margin, done here through the NIF directly.
    W = register_worker(T, <<"w1">>),
    R = make_ref(),
    {ok, Waiter} = couch_workers_nif:job_accept(R, T, <<"w1">>, 60000),
    wait_for(fun() -> maps:get(job_waiters, couch_workers:stats()) =:= 1 end, 5000),
    ?assertEqual(abandoned, couch_workers_nif:job_accept_abandon(Waiter)),
    ?assertEqual(abandoned, couch_workers_nif:job_accept_abandon(Waiter)),
    %% The dispatcher drops it; a job added now is not taken for it, and
    %% no answer ever comes.
    wait_for(fun() -> maps:get(job_waiters, couch_workers:stats()) =:= 0 end, 5000),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual({error, timeout}, couch_workers_nif:wait(R, 300)),
    ?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    %% Once the answer was sent, abandoning is too late: `delivered'.
    R2 = make_ref(),
    {ok, Waiter2} = couch_workers_nif:job_accept(R2, T, <<"w1">>, 0),
    {ok, #{id := <<"j1">>} = Job} = couch_workers_nif:wait(R2, 5000),
    ?assertEqual(delivered, couch_workers_nif:job_accept_abandon(Waiter2)),
    ok = couch_workers:job_finish(Job, #{}),
    ok = couch_workers:worker_unregister(W).

waiters_and_dispatchers_do_not_leak(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {got, self(), couch_workers:job_accept(W, #{timeout => 5000})} end) || _ <- lists:seq(1, 4)],
    wait_for(fun() -> maps:get(job_waiters, couch_workers:stats()) =:= 4 end, 5000),
    #{job_dispatchers := 1} = couch_workers:stats(),
    ok = couch_workers:job_add_many(T, [{integer_to_binary(I), #{}, #{}} || I <- lists:seq(1, 4)]),
    Got = [
        receive
            {got, P, {ok, #{id := Id}}} -> Id
        after 5000 -> error(timeout)
        end
     || P <- Pids
    ],
    ?assertEqual([<<"1">>, <<"2">>, <<"3">>, <<"4">>], lists:sort(Got)),
    settled_stats(#{job_waiters => 0, job_dispatchers => 0, accept_waiters => 0, job_sweepers => 1}),
    ok = couch_workers:worker_unregister(W).

%% ---- helpers ---------------------------------------------------------------

%% Accepts (no wait) and finishes until the queue is empty; returns the
%% ids in accept order.
accept_all(W, Acc) ->
    case couch_workers:job_accept(W, #{}) of
        {ok, #{id := Id} = Job} ->
            ok = couch_workers:job_finish(Job, #{}),
            accept_all(W, [Id | Acc]);
        {error, not_found} ->
            lists:reverse(Acc)
    end.

%% A worker's loop: accept (waiting up to 1.5 s), finish, again; returns
%% the ids it took once no job came.
work(W, Acc) ->
    case couch_workers:job_accept(W, #{timeout => 1500}) of
        {ok, #{id := Id} = Job} ->
            ok = couch_workers:job_finish(Job, #{<<"by">> => self_name()}),
            work(W, [Id | Acc]);
        {error, not_found} ->
            lists:reverse(Acc)
    end.

self_name() ->
    list_to_binary(pid_to_list(self())).
