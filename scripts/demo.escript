#!/usr/bin/env escript
%% -*- erlang -*-
%%! -noshell
%%
%% The couch_workers demo: two Erlang nodes (two OS processes) share one
%% embedded store, as CouchDB nodes share one FoundationDB.
%%
%%   node A (this escript)     subscribes to the membership of "replicator",
%%                             adds six replicator jobs, serves the status
%%                             page (its URL is printed)
%%   node B (a separate `erl`) registers three workers, timeout 3 s, each
%%                             of which takes two jobs and keeps them running
%%
%% Then B is killed with `kill -9`: no goodbye, no unregister. A's reaper
%% sees B's heartbeats stop on the store's clock and removes B's workers;
%% A's subscription shows them leave, B's jobs go back to the queue, and a
%% worker on A takes and finishes them.
-mode(compile).

main([EbinDir, StoreArg]) ->
    true = code:add_patha(EbinDir),
    ok = application:load(couch_workers),
    {StoreA, StoreB} = stores(StoreArg),
    ok = application:set_env(couch_workers, store, StoreA),
    ok = application:set_env(couch_workers, http, #{port => 0}),
    {ok, _} = application:ensure_all_started(couch_workers),
    say("node A: status page at http://127.0.0.1:~b/ (while the demo runs)", [couch_workers_http:port()]),
    Type = <<"replicator">>,
    Jobs = [iolist_to_binary(["job-", integer_to_list(I)]) || I <- lists:seq(1, 6)],
    [ok = couch_workers:job_add(Type, J, #{<<"db">> => J}, #{}) || J <- Jobs],
    say("node A: added 6 jobs of type ~s; pending: ~b", [Type, couch_workers:job_pending_count(Type)]),
    say("node A: subscribing to the membership of ~s", [Type]),
    Sub = couch_workers:membership_subscribe(Type, nil, self()),
    {Workers0, _} = next_membership(Sub, 5000),
    show(Workers0),
    say("node A: starting node B (a separate erl process) on the same store", []),
    {Port, BPid} = start_node_b(EbinDir, StoreB),
    wait_for(Sub, fun(W) -> map_size(W) =:= 3 end, 20000),
    running(Type, 6, 20000),
    [
        say("node A reads from the store: worker ~s runs ~b jobs, heartbeat ~b ms ago", [Id, R, Age])
     || #{id := Id, running := R, heartbeat_age_ms := Age} <- couch_workers:workers(Type)
    ],
    say("node B (OS pid ~s) registered 3 workers, running 6 jobs; now: kill -9 ~s", [BPid, BPid]),
    T0 = erlang:monotonic_time(millisecond),
    os:cmd("kill -9 " ++ BPid),
    catch port_close(Port),
    wait_for(Sub, fun(W) -> map_size(W) =:= 0 end, 15000),
    Ms = erlang:monotonic_time(millisecond) - T0,
    say("node A: node B's workers left the membership ~b ms after the kill "
        "(their timeout: 3000 ms)", [Ms]),
    say("node A: B's jobs are back in the queue: pending ~b", [couch_workers:job_pending_count(Type)]),
    W = couch_workers:worker_register(Type, <<"a-1">>, #{node => <<"A">>}, self()),
    Done = [finish_one(W) || _ <- Jobs],
    say("node A: worker a-1 finished ~0p", [lists:sort(Done)]),
    [{ok, #{state := finished}} = couch_workers:job_get(Type, J) || J <- Jobs],
    #{types := #{Type := M}} = couch_workers:metrics(),
    say("node A's metrics: ~0p", [maps:with([jobs_added, jobs_accepted, jobs_finished, jobs_requeued, workers_reaped], M)]),
    ok = couch_workers:worker_unregister(W),
    ok = couch_workers:membership_unsubscribe(Sub),
    application:stop(couch_workers),
    halt(0);
main(_) ->
    io:format(standard_error, "usage: demo.escript EBIN_DIR embedded:STORE_DIR | fdb:CLUSTER_FILE~n", []),
    halt(2).

%% The stores of node A and node B: one embedded directory; or on
%% FoundationDB, a directory of the demo's own (couch_workers_test/Name,
%% never CouchDB's `couchdb'), which A removes when it stops and B joins.
stores("embedded:" ++ Dir) ->
    {{embedded, Dir}, {embedded, Dir}};
stores("fdb:" ++ ClusterFile) ->
    Name = "demo_" ++ os:getpid(),
    say("node A: on FoundationDB (cluster file ~s), directory couch_workers_test/~s", [ClusterFile, Name]),
    {{fdb_test, ClusterFile, Name}, {fdb_test, ClusterFile, Name, shared}};
stores(Other) ->
    fail("unknown store ~p: embedded:DIR or fdb:CLUSTER_FILE", [Other]).

start_node_b(EbinDir, Store) ->
    Erl = os:find_executable("erl"),
    Eval = lists:flatten(io_lib:format(
        "ok = application:load(couch_workers),"
        "ok = application:set_env(couch_workers, store, ~p),"
        "{ok, _} = application:ensure_all_started(couch_workers),"
        "[spawn(fun() -> "
        "   W = couch_workers:worker_register(<<\"replicator\">>, Id, "
        "     #{timeout => 3, node => <<\"B\">>}, self()), "
        "   [couch_workers:job_accept(W, #{timeout => 10000}) || _ <- [1, 2]], "
        "   timer:sleep(infinity) end) "
        " || Id <- [<<\"b-1\">>, <<\"b-2\">>, <<\"b-3\">>]],"
        "io:format(\"demo_node_b_pid ~~s~~n\", [os:getpid()]),"
        "timer:sleep(infinity).", [Store])),
    Port = open_port({spawn_executable, Erl},
                     [{args, ["-noshell", "-pa", EbinDir, "-eval", Eval]},
                      {line, 256}, exit_status, use_stdio]),
    {Port, b_pid(Port)}.

%% Node B's OS pid, from its marked line: the lines before it are its log
%% (reports the app writes at start).
b_pid(Port) ->
    receive
        {Port, {data, {eol, "demo_node_b_pid " ++ Pid}}} -> string:trim(Pid);
        {Port, {data, _}} -> b_pid(Port);
        {Port, {exit_status, S}} -> fail("node B exited with status ~p", [S])
    after 30000 -> fail("node B did not start", [])
    end.

%% Waits until N jobs of Type run (read from the store: workers/1).
running(Type, N, Timeout) when Timeout > 0 ->
    case lists:sum([R || #{running := R} <- couch_workers:workers(Type)]) of
        N -> ok;
        _ -> timer:sleep(50), running(Type, N, Timeout - 50)
    end;
running(_Type, N, _Timeout) ->
    fail("node B's workers did not take ~b jobs", [N]).

finish_one(W) ->
    case couch_workers:job_accept(W, #{timeout => 5000}) of
        {ok, #{id := Id} = Job} ->
            ok = couch_workers:job_finish(Job, #{<<"by">> => <<"a-1">>}),
            Id;
        Other ->
            fail("node A's worker got no job: ~p", [Other])
    end.

wait_for(Sub, Pred, Timeout) ->
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    wait_loop(Sub, Pred, Deadline).

wait_loop(Sub, Pred, Deadline) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    {Workers, _VS} = next_membership(Sub, Left),
    show(Workers),
    case Pred(Workers) of
        true -> Workers;
        false -> wait_loop(Sub, Pred, Deadline)
    end.

next_membership(Sub, Timeout) ->
    receive
        {couch_workers_membership, _Type, Workers, VS, Sub} -> {Workers, VS}
    after Timeout -> fail("no membership change within ~b ms", [Timeout])
    end.

show(Workers) ->
    Ids = lists:sort(maps:keys(Workers)),
    say("node A: membership of replicator = ~p", [Ids]).

say(Fmt, Args) ->
    io:format("[~s] " ++ Fmt ++ "~n", [calendar:system_time_to_rfc3339(
        erlang:system_time(millisecond), [{unit, millisecond}]) | Args]).

fail(Fmt, Args) ->
    io:format(standard_error, "demo failed: " ++ Fmt ++ "~n", Args),
    halt(1).
