#!/usr/bin/env escript
%% -*- erlang -*-
%%! -noshell
%%
%% Renders the status page with headless Chromium while a demo workload
%% runs, to a PNG (scripts/status-shot.sh runs this; docs/status-page.png).
%%
%%   replicator: 3 workers (timeouts 3, 15 and 60 s: their heartbeat-age
%%               bars differ), no jobs
%%   indexer:    4 workers that take jobs and finish each in 50-300 ms
%%               (one in 12 fails, for good: the page lists the latest);
%%               a producer adds about 15 jobs a second
%%   compaction: paused (job_pause/1): jobs added, and a worker waiting
%%               that takes none of them (they stay pending)
-mode(compile).

main([EbinDir, StoreDir, Port, Png]) ->
    true = code:add_patha(EbinDir),
    ok = application:load(couch_workers),
    ok = application:set_env(couch_workers, store, {embedded, StoreDir}),
    ok = application:set_env(couch_workers, http, #{port => list_to_integer(Port)}),
    logger:set_primary_config(level, warning),
    {ok, _} = application:ensure_all_started(couch_workers),
    Url = "http://127.0.0.1:" ++ integer_to_list(couch_workers_http:port()) ++ "/",
    io:format("status page: ~s~n", [Url]),
    [
        couch_workers:worker_register(<<"replicator">>, Id, #{timeout => T, node => <<"node-a">>}, self())
     || {Id, T} <- [{<<"repl-1">>, 3}, {<<"repl-2">>, 15}, {<<"repl-3">>, 60}]
    ],
    [spawn_link(fun() -> indexer(I) end) || I <- lists:seq(1, 4)],
    ok = couch_workers:job_pause(<<"compaction">>),
    spawn_link(fun() ->
        W = couch_workers:worker_register(<<"compaction">>, <<"comp-1">>, #{timeout => 15}, self()),
        work(W)
    end),
    spawn_link(fun() -> producer(<<"indexer">>, 0, 60) end),
    spawn_link(fun() -> producer(<<"compaction">>, 0, 2000) end),
    %% Four samples of the throughput chart (one per 10 s).
    Wait = 42,
    io:format("running the workload for ~b s ...~n", [Wait]),
    timer:sleep(Wait * 1000),
    Cmd = io_lib:format(
        "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,900 --screenshot='~s' '~s' 2>&1",
        [Png, Url]
    ),
    io:format("~s~n", [os:cmd(lists:flatten(Cmd))]),
    case filelib:file_size(Png) of
        0 -> io:format("no PNG was written~n"), halt(1);
        Size -> io:format("wrote ~s (~b bytes)~n", [Png, Size]), halt(0)
    end;
main(_) ->
    io:format("usage: status_shot.escript EBIN_DIR STORE_DIR PORT PNG~n"),
    halt(1).

indexer(I) ->
    Id = iolist_to_binary(["idx-", integer_to_list(I)]),
    W = couch_workers:worker_register(<<"indexer">>, Id, #{timeout => 15, slots => 1}, self()),
    work(W).

work(W) ->
    case couch_workers:job_accept(W, #{timeout => 1000}) of
        {ok, Job} ->
            timer:sleep(50 + rand:uniform(250)),
            case rand:uniform(12) of
                1 ->
                    #{info := #{<<"db">> := Db}} = Job,
                    ok = couch_workers:job_fail(Job, #{<<"reason">> => <<"bad_ddoc">>, <<"db">> => Db}, #{retry => false});
                _ ->
                    ok = couch_workers:job_finish(Job, #{<<"ok">> => true})
            end;
        {error, _} ->
            ok
    end,
    work(W).

producer(Type, N, EveryMs) ->
    ok = couch_workers:job_add(Type, iolist_to_binary(["job-", integer_to_list(N)]), #{<<"db">> => <<"db", (integer_to_binary(N rem 7))/binary>>}, #{}),
    timer:sleep(EveryMs),
    producer(Type, N + 1, EveryMs).
