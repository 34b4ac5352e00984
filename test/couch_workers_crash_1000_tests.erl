%% @doc Crash of a node: a peer `erl' node (a separate
%% OS process on the same embedded store) holds 1,000 running jobs across
%% four workers (health timeout 2 s); it is killed with `kill -9'. Checked
%% by counting, not by sampling:
%%
%% * before the kill, every one of the 1,000 jobs is `running' for the
%%   worker of the peer that accepted it (`job_get' of every id), and the
%%   pending count is 0;
%% * after the kill, the pending count reaches 1,000 within the workers'
%%   timeout + 1 s, and then `job_get' of every id says `pending', no
%%   worker, `attempts' 1;
%% * four workers on this node take and finish all of them: every id is
%%   accepted exactly once in the surviving run (the accept results are
%%   counted per id), every finish is `ok', and afterwards every id is
%%   `finished' with `attempts' 2 and the result of the worker that took
%%   it; the pending count is 0. No job is lost or finished twice.
%%
%% The peer's workers run 550, 250, 150 and 50 jobs. The first holds more
%% than one transaction may requeue (`REQUEUE_MAX_JOBS' = 500 in
%% `jobs/ops/requeue.rs'): the reaper's transaction that removes it moves 500 and
%% leaves an orphan marker, and a sweeper (one per node, woken at once by
%% a store watch on `orphans_vs', `jobs/sweeper.rs') moves the other 50.
%% So both failover paths are in the 1,000, and both must meet the same
%% deadline: the sweeper's documented latency is that of a store watch
%% (milliseconds), with a 10 s poll only as a safety net for a lost watch.
-module(couch_workers_crash_1000_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

%% Run on the peer (through peer:call/4).
-export([peer_workers/2]).
%% A logger handler that forwards the Rust side's failover events here.
-export([log/2]).

-define(PEER_TIMEOUT, 30000).
-define(TIMEOUT_S, 2).
%% {worker id, jobs it takes}: 1,000 in all.
-define(PEER_WORKERS, [{<<"b1">>, 550}, {<<"b2">>, 250}, {<<"b3">>, 150}, {<<"b4">>, 50}]).
-define(N_JOBS, 1000).
-define(SURVIVORS, [<<"a1">>, <<"a2">>, <<"a3">>, <<"a4">>]).

crash_1000_test_() ->
    couch_workers_test_util:peer_fixture(
        "kill -9 of a node running 1,000 jobs: all back to pending in time, each finished once",
        "crash1000",
        [?TDEF_FE(kill_9_of_node_with_1000_running_jobs, 90)]
    ).

%% ---- the test --------------------------------------------------------------

kill_9_of_node_with_1000_running_jobs(#{peer := Peer, type := T} = Ctx) ->
    Ids = [iolist_to_binary(io_lib:format("job-~4..0b", [N])) || N <- lists:seq(1, ?N_JOBS)],
    ok = couch_workers:job_add_many(T, [{Id, #{<<"n">> => N}, #{}} || {N, Id} <- lists:enumerate(Ids)]),
    ?assertEqual(?N_JOBS, couch_workers:job_pending_count(T)),

    %% The peer's workers take all of them and keep them running.
    {ok, Taken} = peer:call(Peer, ?MODULE, peer_workers, [T, ?PEER_WORKERS], ?PEER_TIMEOUT),
    [?assertEqual(N, length(maps:get(W, Taken))) || {W, N} <- ?PEER_WORKERS],
    Owner = maps:from_list([{Id, W} || {W, JobIds} <- maps:to_list(Taken), Id <- JobIds]),
    ?assertEqual(lists:sort(Ids), lists:sort(maps:keys(Owner))),
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    Running = [
        case couch_workers:job_get(T, Id) of
            {ok, #{state := running, worker := W, attempts := 1}} -> W;
            Other -> {Id, Other}
        end
     || Id <- Ids
    ],
    ?assertEqual([maps:get(Id, Owner) || Id <- Ids], Running),

    %% kill -9: no goodbye; only the peer's heartbeats stop.
    ok = capture_failover_events(),
    T0 = erlang:monotonic_time(millisecond),
    couch_workers_test_util:kill_peer(Ctx),
    Deadline = T0 + (?TIMEOUT_S + 1) * 1000,
    Progress = wait_count(T, ?N_JOBS, T0, T0 + (?TIMEOUT_S + 10) * 1000, []),
    {AllBackMs, _} = hd(Progress),
    [{FirstMs, _} | _] = [P || {_, C} = P <- lists:reverse(Progress), C > 0],
    io:format(
        standard_error,
        "~n    kill -9 of a node running ~b jobs (4 workers, timeout ~b s): first back to pending after ~b ms, "
        "all ~b after ~b ms; pending count over time (ms, count): ~w~n",
        [?N_JOBS, ?TIMEOUT_S, FirstMs, ?N_JOBS, AllBackMs, compress(lists:reverse(Progress))]
    ),
    ?assert(T0 + AllBackMs =< Deadline),
    %% Counted one by one.
    Back = [
        case couch_workers:job_get(T, Id) of
            {ok, #{state := pending, worker := null, attempts := 1}} -> ok;
            Other -> {Id, Other}
        end
     || Id <- Ids
    ],
    ?assertEqual([], [B || B <- Back, B =/= ok]),
    ?assertEqual(?N_JOBS, couch_workers:job_pending_count(T)),
    %% Both failover paths ran: this node's reaper removed the four
    %% workers (500 + 250 + 150 + 50 jobs in their removal transactions),
    %% and its sweeper moved the 50 that b1's removal left behind.
    Events = failover_events(T, 5, 5000),
    Reaped = lists:sort([Id || #{what := worker_reaped, id := Id} <- Events]),
    Swept = [{W, N} || #{what := orphaned_jobs_requeued, worker := W, count := N} <- Events],
    io:format(standard_error, "    reaped by this node: ~p; moved by the orphan sweeper: ~p~n", [Reaped, Swept]),
    ?assertEqual([W || {W, _} <- ?PEER_WORKERS], Reaped),
    ?assertEqual([{<<"b1">>, 50}], Swept),

    %% Workers of this node take and finish them all.
    Self = self(),
    Workers = [
        spawn_link(fun() ->
            W = couch_workers:worker_register(T, Id, #{timeout => 15}, self()),
            Self ! {done, Id, work(W, Id, [])},
            ok = couch_workers:worker_unregister(W)
        end)
     || Id <- ?SURVIVORS
    ],
    Results = [
        receive
            {done, Id, R} -> {Id, R}
        after 60000 -> error({survivor_timeout, Id})
        end
     || Id <- ?SURVIVORS
    ],
    _ = Workers,
    %% Every accept result, counted per id.
    Accepts = [{JobId, W, Fin} || {W, Rs} <- Results, {JobId, Fin} <- Rs],
    PerId = lists:foldl(fun({JobId, _, _}, M) -> maps:update_with(JobId, fun(C) -> C + 1 end, 1, M) end, #{}, Accepts),
    Twice = [Id || {Id, C} <- maps:to_list(PerId), C > 1],
    Lost = [Id || Id <- Ids, not maps:is_key(Id, PerId)],
    Unknown = [Id || Id <- maps:keys(PerId), not maps:is_key(Id, Owner)],
    BadFinish = [{Id, F} || {Id, _, F} <- Accepts, F =/= ok],
    io:format(
        standard_error,
        "    survivors took ~b jobs (~s): accepted twice ~b, lost ~b, failed finishes ~b~n",
        [
            length(Accepts),
            lists:join(", ", [io_lib:format("~s: ~b", [W, length(Rs)]) || {W, Rs} <- Results]),
            length(Twice),
            length(Lost),
            length(BadFinish)
        ]
    ),
    ?assertEqual([], Twice),
    ?assertEqual([], Lost),
    ?assertEqual([], Unknown),
    ?assertEqual([], BadFinish),
    ?assertEqual(?N_JOBS, length(Accepts)),
    By = maps:from_list([{JobId, W} || {JobId, W, _} <- Accepts]),
    Final = [
        case couch_workers:job_get(T, Id) of
            {ok, #{state := finished, worker := null, attempts := 2, result := #{<<"by">> := W}}} ->
                case maps:get(Id, By) of
                    W -> ok;
                    Other -> {Id, {finished_by, W, accepted_by, Other}}
                end;
            Other ->
                {Id, Other}
        end
     || Id <- Ids
    ],
    ?assertEqual([], [F || F <- Final, F =/= ok]),
    ?assertEqual(0, couch_workers:job_pending_count(T)).

%% ---- failover events ------------------------------------------------------------

%% Forwards `worker_reaped' and `orphaned_jobs_requeued' (notice level)
%% to this process, while the default handler still prints warnings only.
capture_failover_events() ->
    _ = logger:remove_handler(?MODULE),
    {ok, #{level := Level}} = logger:get_handler_config(default),
    persistent_term:put({?MODULE, default_level}, Level),
    ok = logger:update_handler_config(default, level, warning),
    ok = logger:add_handler(?MODULE, ?MODULE, #{level => notice, config => #{pid => self()}}),
    ok = logger:set_primary_config(level, notice).

log(#{msg := {report, #{what := What} = Report}}, #{config := #{pid := Pid}}) when
    What =:= worker_reaped; What =:= orphaned_jobs_requeued
->
    Pid ! {failover_event, Report},
    ok;
log(_Event, _Config) ->
    ok.

%% The first N failover events of type T (or those that came in Timeout
%% ms); then the logger is as the suites set it.
failover_events(T, N, Timeout) ->
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    Events = collect_events(T, N, Deadline, []),
    ok = logger:remove_handler(?MODULE),
    ok = logger:set_primary_config(level, warning),
    ok = logger:update_handler_config(default, level, persistent_term:get({?MODULE, default_level}, all)),
    Events.

collect_events(_T, 0, _Deadline, Acc) ->
    lists:reverse(Acc);
collect_events(T, N, Deadline, Acc) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {failover_event, #{type := T} = E} -> collect_events(T, N - 1, Deadline, [E | Acc]);
        {failover_event, _} -> collect_events(T, N, Deadline, Acc)
    after Left -> lists:reverse(Acc)
    end.

%% Polls the pending count (every 10 ms) until it is N; returns the
%% changes seen, newest first, as {ms since T0, count}.
wait_count(T, N, T0, Until, Seen) ->
    Now = erlang:monotonic_time(millisecond),
    C = couch_workers:job_pending_count(T),
    Seen1 =
        case Seen of
            [{_, C} | _] -> Seen;
            _ -> [{Now - T0, C} | Seen]
        end,
    if
        C =:= N ->
            Seen1;
        Now > Until ->
            erlang:error({not_back_to_pending, lists:reverse(Seen1)});
        true ->
            timer:sleep(10),
            wait_count(T, N, T0, Until, Seen1)
    end.

%% The count changes without the leading zeros.
compress(Progress) ->
    [P || {_, C} = P <- Progress, C > 0].

%% A survivor's loop: accept (no wait: all jobs are pending already) and
%% finish, until the queue is empty; returns [{JobId, FinishResult}].
work(W, Me, Acc) ->
    case couch_workers:job_accept(W, #{}) of
        {ok, #{id := JobId, attempts := 2} = Job} ->
            Fin = couch_workers:job_finish(Job, #{<<"by">> => Me}),
            work(W, Me, [{JobId, Fin} | Acc]);
        {ok, #{id := JobId, attempts := A}} ->
            work(W, Me, [{JobId, {attempts, A}} | Acc]);
        {error, not_found} ->
            lists:reverse(Acc)
    end.

%% ---- run on the peer -------------------------------------------------------

%% One long-lived process per worker (its owner): registers it (health
%% timeout 2 s) and accepts its number of jobs, which it keeps running.
%% Answers #{WorkerId => [JobId]}: references and handles do not travel
%% between non-distributed nodes.
peer_workers(Type, Specs) ->
    Caller = self(),
    [
        spawn(fun() ->
            W = couch_workers:worker_register(Type, Id, #{timeout => ?TIMEOUT_S}, self()),
            Taken = accept_n(W, N, []),
            Caller ! {taken, Id, Taken},
            receive
                stop -> ok
            end
        end)
     || {Id, N} <- Specs
    ],
    collect(Specs, #{}).

accept_n(_W, 0, Acc) ->
    lists:reverse(Acc);
accept_n(W, N, Acc) ->
    case couch_workers:job_accept(W, #{timeout => 5000}) of
        {ok, #{id := JobId}} -> accept_n(W, N - 1, [JobId | Acc]);
        Error -> lists:reverse([Error | Acc])
    end.

collect([], Acc) ->
    {ok, Acc};
collect([{Id, _} | Rest], Acc) ->
    receive
        {taken, Id, Taken} -> collect(Rest, Acc#{Id => Taken})
    after 25000 -> {error, {timeout, Id}}
    end.
