%% @doc The application: stop/start, the node lifecycle, supervision
%% (killed servers come back), unknown messages, logging, the runtime.
-module(couch_workers_app_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [
    unique_type/1,
    wait_for/2,
    wait_membership/3,
    recv_membership/2,
    settled_stats/1
]).

%% logger handler callback (forwards events to the test process)
-export([log/2]).

app_test_() ->
    {
        "couch_workers application",
        {
            setup,
            fun() -> ok end,
            fun(_) -> ok end,
            {
                foreach,
                fun couch_workers_test_util:start_app/0,
                fun stop_app/1,
                [
                    ?TDEF_FE(stop_ends_every_task_and_start_works_again, 15),
                    ?TDEF_FE(stop_unregisters_workers),
                    ?TDEF_FE(second_start_is_refused),
                    ?TDEF_FE(killed_local_server_restarts),
                    ?TDEF_FE(killed_global_server_restarts),
                    ?TDEF_FE(killed_events_server_restarts),
                    ?TDEF_FE(unknown_messages_are_logged_not_fatal),
                    ?TDEF_FE(rust_log_events_reach_logger),
                    ?TDEF_FE(runtime_threads_are_named_and_counted),
                    ?TDEF_FE(bad_store_config_fails_start)
                ]
            }
        }
    }.

%% Tests may leave the app stopped.
stop_app(#{dir := Dir} = Ctx) ->
    case lists:keymember(couch_workers, 1, application:which_applications()) of
        true -> couch_workers_test_util:stop_app(Ctx);
        false -> file:del_dir_r(Dir)
    end.

%% ---- tests ---------------------------------------------------------------

stop_ends_every_task_and_start_works_again(#{}) ->
    T = unique_type("app"),
    Holder = spawn_link(fun() -> receive stop -> ok end end),
    S = couch_workers:membership_subscribe(T, nil, self()),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, Holder),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    %% (Tasks count themselves once they first run: settled_stats waits.)
    settled_stats(#{running => true, reapers => 1, heartbeats => 1, watchers => 1}),
    ok = application:stop(couch_workers),
    %% Node::stop waited for every task: nothing is left running.
    ?assertMatch(
        #{running := false, heartbeats := 0, watchers := 0, reapers := 0},
        couch_workers:stats()
    ),
    ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
    %% The NIF handles went with the servers that held them.
    settled_stats(#{registrations => 0, watches => 0}),
    %% Calls without the app answer, they do not hang or crash.
    ?assertEqual({error, not_started}, couch_workers:worker_register(T, <<"w2">>, #{}, Holder)),
    ?assertEqual({error, not_started}, couch_workers:membership_subscribe(T, nil, self())),
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)),
    ok = application:start(couch_workers),
    %% (The reaper counts itself once its task first runs: wait for it.)
    settled_stats(#{running => true, reapers => 1, heartbeats => 0, watchers => 0}),
    %% It works again, on the same store; the old worker is gone from it.
    S2 = couch_workers:membership_subscribe(T, nil, self()),
    ?assertMatch({_, #{}}, recv_membership(S2, 5000)),
    Ref2 = couch_workers:worker_register(T, <<"w1">>, #{}, Holder),
    ?assert(is_reference(Ref2)),
    ?assertNotEqual(Ref, Ref2),
    wait_membership(S2, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    settled_stats(#{heartbeats => 1, watchers => 1}),
    Holder ! stop.

stop_unregisters_workers(#{dir := Dir}) ->
    %% The stop writes the removals before the node closes: a fresh
    %% subscriber after a restart sees no worker.
    T = unique_type("app"),
    Holder = spawn_link(fun() -> receive stop -> ok end end),
    Refs = [couch_workers:worker_register(T, integer_to_binary(I), #{timeout => 60}, Holder) || I <- lists:seq(1, 5)],
    [?assert(is_reference(R)) || R <- Refs],
    ok = application:stop(couch_workers),
    ok = application:set_env(couch_workers, store, {embedded, Dir}),
    ok = application:start(couch_workers),
    S = couch_workers:membership_subscribe(T, nil, self()),
    %% With a 60 s timeout only the unregister can have removed them.
    ?assertMatch({_, W} when W =:= #{}, recv_membership(S, 5000)),
    Holder ! stop.

second_start_is_refused(#{}) ->
    ?assertEqual({error, {already_started, couch_workers}}, application:start(couch_workers)),
    ?assertEqual({error, already_started}, couch_workers_nif:start(make_ref(), #{})),
    settled_stats(#{running => true, reapers => 1}).

killed_local_server_restarts(#{}) ->
    T = unique_type("app"),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    Old = whereis(couch_workers_local),
    exit(Old, kill),
    New = couch_workers_test_util:wait_restarted(couch_workers_local, Old),
    ?assertNotEqual(Old, New),
    %% Its table is the supervisor's: the new server restored the
    %% registration (more in couch_workers_restart_tests).
    ?assertEqual(Ref, couch_workers:worker_register(T, <<"w1">>, #{}, self())),
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    Ref2 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assert(is_reference(Ref2)),
    ?assertNotEqual(Ref, Ref2),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ok = couch_workers:worker_unregister(Ref2),
    ok = couch_workers:membership_unsubscribe(S).

killed_global_server_restarts(#{}) ->
    T = unique_type("app"),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    #{watchers := 1} = couch_workers:stats(),
    Old = whereis(couch_workers_global),
    exit(Old, kill),
    New = couch_workers_test_util:wait_restarted(couch_workers_global, Old),
    ?assertNotEqual(Old, New),
    %% The subscription was restored, with a new watcher (the old one
    %% stopped when its handle went with the old server).
    settled_stats(#{watchers => 1, watches => 1}),
    ?assertMatch({ok, _, #{}}, couch_workers:get_workers(T)),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ok = couch_workers:worker_unregister(Ref),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ok = couch_workers:membership_unsubscribe(S),
    settled_stats(#{watchers => 0, watches => 0}).

killed_events_server_restarts(#{}) ->
    Old = whereis(couch_workers_events),
    exit(Old, kill),
    New = couch_workers_test_util:wait_restarted(couch_workers_events, Old),
    ?assertNotEqual(Old, New),
    %% The new one gets the Rust side's log events.
    with_log_handler(fun() ->
        Ref = make_ref(),
        ok = couch_workers_nif:test_panic(Ref),
        {error, {panic, _}} = couch_workers_nif:wait(Ref, 5000),
        ?assertMatch({error, #{what := rust_panic}}, recv_log(rust_panic, 5000))
    end).

unknown_messages_are_logged_not_fatal(#{}) ->
    Servers = [couch_workers_local, couch_workers_global, couch_workers_events],
    Pids = [whereis(S) || S <- Servers],
    [?assertEqual({error, {bad_call, bogus}}, gen_server:call(S, bogus)) || S <- Servers],
    [gen_server:cast(S, bogus) || S <- Servers],
    [S ! bogus || S <- Servers],
    %% A late or unknown NIF-style reply is ignored, too.
    [S ! {make_ref(), {ok, late}} || S <- [couch_workers_local]],
    %% Still the same processes, still answering.
    _ = sys:get_state(couch_workers_local),
    _ = sys:get_state(couch_workers_global),
    _ = sys:get_state(couch_workers_events),
    ?assertEqual(Pids, [whereis(S) || S <- Servers]).

rust_log_events_reach_logger(#{dir := Dir}) ->
    with_log_handler(fun() ->
        %% A restart logs the store's opening from Rust (notice)...
        ok = application:stop(couch_workers),
        ok = application:set_env(couch_workers, store, {embedded, Dir}),
        ok = application:start(couch_workers),
        {notice, Report} = recv_log(store_opened, 5000),
        ?assertMatch(#{store := <<"embedded">>, durability := D} when is_binary(D), Report),
        %% ...and a Rust panic is an error event, not a line on stderr.
        Ref = make_ref(),
        ok = couch_workers_nif:test_panic(Ref),
        {error, {panic, _}} = couch_workers_nif:wait(Ref, 5000),
        {error, Panic} = recv_log(rust_panic, 5000),
        ?assertMatch(#{message := <<"couch_workers test panic">>, thread := <<"cw-runtime">>}, Panic),
        %% Erlang-side events: a registration is logged at debug.
        T = unique_type("log"),
        Ref2 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
        ?assertMatch({debug, #{type := T, id := <<"w1">>}}, recv_log(worker_registered, 5000)),
        ok = couch_workers:worker_unregister(Ref2)
    end).

runtime_threads_are_named_and_counted(#{}) ->
    #{runtime_threads := N} = couch_workers:stats(),
    ?assertEqual(2, N),
    Task = "/proc/" ++ os:getpid() ++ "/task",
    case filelib:is_dir(Task) of
        false ->
            io:format(standard_error, "~n*** SKIPPED thread names: no ~s~n", [Task]),
            ok;
        true ->
            %% A thread that a runtime thread has just created (the
            %% embedded store's watcher and checkpointer are born there)
            %% carries its creator's name until it names itself: count
            %% again for a while rather than catch one in that window.
            Count = fun() ->
                {ok, Tids} = file:list_dir(Task),
                length([X || Tid <- Tids, (X = thread_name(Task, Tid)) =:= <<"cw-runtime">>])
            end,
            _ = (catch couch_workers_test_util:wait_for(fun() -> Count() =:= N end, 2000)),
            ?assertEqual(N, Count())
    end.

bad_store_config_fails_start(#{dir := Dir}) ->
    ok = application:stop(couch_workers),
    try
        ok = application:set_env(couch_workers, store, {bogus, Dir}),
        ?assertMatch({error, {{node_start_failed, {badconfig, store}}, _}}, application:start(couch_workers)),
        ok = application:set_env(couch_workers, store, {embedded, "/proc/couch_workers_cannot_be_here"}),
        ?assertMatch({error, {{node_start_failed, _}, _}}, application:start(couch_workers)),
        ok = application:set_env(couch_workers, store, {embedded, Dir}),
        ok = application:set_env(couch_workers, tx_timeout_ms, 0),
        ?assertMatch(
            {error, {{node_start_failed, {badconfig, tx_timeout_ms}}, _}}, application:start(couch_workers)
        ),
        ok = application:set_env(couch_workers, tx_timeout_ms, 5000),
        %% The NIF checks the range (a day at most: no deadline computed
        %% from it can overflow).
        lists:foreach(
            fun(Bad) ->
                ok = application:set_env(couch_workers, embedded_safety_look_ms, Bad),
                ?assertMatch(
                    {error, {{node_start_failed, {badconfig, embedded_safety_look_ms}}, _}},
                    application:start(couch_workers)
                )
            end,
            [0, 86400001, ten_seconds]
        ),
        ?assertMatch(#{running := false, reapers := 0}, couch_workers:stats())
    after
        ok = application:set_env(couch_workers, store, {embedded, Dir}),
        ok = application:set_env(couch_workers, tx_timeout_ms, 5000),
        ok = application:unset_env(couch_workers, embedded_safety_look_ms)
    end,
    %% A failed start leaves nothing behind: a good one works.
    ok = application:start(couch_workers),
    settled_stats(#{running => true, reapers => 1}).

%% ---- helpers -------------------------------------------------------------


thread_name(Task, Tid) ->
    case file:read_file(filename:join([Task, Tid, "comm"])) of
        {ok, Bin} -> string:trim(Bin);
        {error, _} -> <<>>
    end.

%% Runs Fun with a logger handler that forwards every event to this
%% process, and the primary level at `all'.
with_log_handler(Fun) ->
    #{level := Primary} = logger:get_primary_config(),
    {ok, #{level := DefaultLevel}} = logger:get_handler_config(default),
    ok = logger:set_handler_config(default, level, warning),
    ok = logger:add_handler(cw_test_handler, ?MODULE, #{level => all, config => #{pid => self()}}),
    ok = logger:set_primary_config(level, all),
    try
        Fun()
    after
        logger:set_primary_config(level, Primary),
        logger:remove_handler(cw_test_handler),
        logger:set_handler_config(default, level, DefaultLevel)
    end.

log(#{level := Level, msg := {report, Report}}, #{config := #{pid := Pid}}) when is_map(Report) ->
    Pid ! {cw_log, Level, Report};
log(_Event, _Config) ->
    ok.

recv_log(What, Timeout) ->
    receive
        {cw_log, Level, #{what := What} = Report} -> {Level, Report}
    after Timeout -> timeout
    end.
