#!/usr/bin/env escript
%% -*- erlang -*-
%%! -noshell
%%
%% The couch_workers demo: two Erlang nodes (two OS processes) share one
%% embedded store, as CouchDB nodes share one FoundationDB.
%%
%%   node A (this escript)     subscribes to the membership of "replicator"
%%   node B (a separate `erl`) registers three workers, timeout 3 s
%%
%% Then B is killed with `kill -9`: no goodbye, no unregister. A's reaper
%% sees B's heartbeats stop on the store's clock and removes B's workers;
%% A's subscription shows them leave.
-mode(compile).

main([EbinDir, StoreDir]) ->
    true = code:add_patha(EbinDir),
    ok = application:load(couch_workers),
    ok = application:set_env(couch_workers, store, {embedded, StoreDir}),
    {ok, _} = application:ensure_all_started(couch_workers),
    Type = <<"replicator">>,
    say("node A: subscribing to the membership of ~s", [Type]),
    Sub = couch_workers:membership_subscribe(Type, nil, self()),
    {Workers0, _} = next_membership(Sub, 5000),
    show(Workers0),
    say("node A: starting node B (a separate erl process) on the same store", []),
    {Port, BPid} = start_node_b(EbinDir, StoreDir),
    wait_for(Sub, fun(W) -> map_size(W) =:= 3 end, 20000),
    say("node B (OS pid ~s) registered 3 workers; now: kill -9 ~s", [BPid, BPid]),
    T0 = erlang:monotonic_time(millisecond),
    os:cmd("kill -9 " ++ BPid),
    catch port_close(Port),
    wait_for(Sub, fun(W) -> map_size(W) =:= 0 end, 15000),
    Ms = erlang:monotonic_time(millisecond) - T0,
    say("node A: node B's workers left the membership ~b ms after the kill "
        "(their timeout: 3000 ms)", [Ms]),
    ok = couch_workers:membership_unsubscribe(Sub),
    application:stop(couch_workers),
    halt(0);
main(_) ->
    io:format(standard_error, "usage: demo.escript EBIN_DIR STORE_DIR~n", []),
    halt(2).

start_node_b(EbinDir, StoreDir) ->
    Erl = os:find_executable("erl"),
    Eval = lists:flatten(io_lib:format(
        "ok = application:load(couch_workers),"
        "ok = application:set_env(couch_workers, store, {embedded, ~p}),"
        "{ok, _} = application:ensure_all_started(couch_workers),"
        "[couch_workers:worker_register(<<\"replicator\">>, Id, "
        "  #{timeout => 3, node => <<\"B\">>}, self()) "
        " || Id <- [<<\"b-1\">>, <<\"b-2\">>, <<\"b-3\">>]],"
        "io:format(\"~~s~~n\", [os:getpid()]),"
        "timer:sleep(infinity).", [StoreDir])),
    Port = open_port({spawn_executable, Erl},
                     [{args, ["-noshell", "-pa", EbinDir, "-eval", Eval]},
                      {line, 256}, exit_status, use_stdio]),
    receive
        {Port, {data, {eol, Line}}} -> {Port, string:trim(Line)};
        {Port, {exit_status, S}} -> fail("node B exited with status ~p", [S])
    after 30000 -> fail("node B did not start", [])
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
