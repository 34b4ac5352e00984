%% @doc bin/couch-workers on a store that this node (running) uses: what
%% it prints (tables and JSON lines), its actions as the node sees them,
%% and its errors and exit status.
-module(couch_workers_cli_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

cli_test_() ->
    {
        "bin/couch-workers on a store in use",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(#{dir := Dir}) ->
                [
                    {timeout, 300, {"status, workers, jobs, job", ?_test(reads(Dir))}},
                    {timeout, 120, {"cancel and remove, seen by the node", ?_test(actions(Dir))}},
                    {timeout, 120, {"errors: exit 1 and a reason", ?_test(errors(Dir))}}
                ]
            end
        }
    }.

%% ---- tests ---------------------------------------------------------------

reads(Dir) ->
    T = unique_type("cli"),
    W = couch_workers:worker_register(T, <<"w1">>, #{slots => 2}, self()),
    [ok = couch_workers:job_add(T, Id, #{<<"n">> => 1}, #{}) || Id <- [<<"j1">>, <<"j2">>, <<"j3">>]],
    {ok, _J} = couch_workers:job_accept(W, #{}),
    %% (The first call may build the binary.)
    {0, Status, _} = cli(Dir, ["status"]),
    ?assertMatch({match, _}, re:run(Status, <<"\\n", T/binary, " +1 +1 ">>)),
    ?assertMatch({match, _}, re:run(Status, <<"\\n", T/binary, " +2\\n">>)),
    {0, Json, _} = cli(Dir, ["--json", "workers", T]),
    ?assertMatch({match, _}, re:run(Json, <<"^\\{\"type\":\"", T/binary, "\",\"id\":\"w1\",\"opts\":\\{\"slots\":2\\},\"timeout\":15,\"heartbeat_age_ms\":[0-9]+,\"running\":1\\}\\n$">>)),
    {0, Jobs, _} = cli(Dir, ["--json", "jobs", T, "--state", "pending", "--limit", "5"]),
    ?assertEqual(2, length(binary:split(Jobs, <<"\n">>, [global, trim_all]))),
    ?assertEqual(nomatch, binary:match(Jobs, <<"\"id\":\"j1\"">>)),
    {0, Job, _} = cli(Dir, ["job", T, "j1"]),
    ?assertMatch({match, _}, re:run(Job, <<"j1 +running +w1 ">>)),
    {0, All, _} = cli(Dir, ["workers"]),
    ?assertMatch({match, _}, re:run(All, <<"^TYPE +ID +TIMEOUT">>)),
    ok = couch_workers:worker_unregister(W).

actions(Dir) ->
    T = unique_type("cli_act"),
    [ok = couch_workers:job_add(T, Id, #{}, #{}) || Id <- [<<"j1">>, <<"j2">>, <<"j3">>]],
    {0, _, _} = cli(Dir, ["cancel", T, "j1"]),
    ?assertMatch({ok, #{state := canceled}}, couch_workers:job_get(T, <<"j1">>)),
    {0, Removed, _} = cli(Dir, ["--json", "remove", T, "j2"]),
    ?assertMatch(<<"{\"action\":\"removed\"", _/binary>>, Removed),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j2">>)),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    %% The node's acceptors go on: the one job left is taken.
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assertMatch({ok, #{id := <<"j3">>}}, couch_workers:job_accept(W, #{timeout => 5000})),
    ok = couch_workers:worker_unregister(W).

errors(Dir) ->
    T = unique_type("cli_err"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Missing = Dir ++ "-nowhere",
    {1, <<>>, E1} = cli(Missing, ["status"]),
    ?assertMatch({match, _}, re:run(E1, "no store at")),
    ?assertNot(filelib:is_dir(Missing)),
    {1, _, E2} = cli(Dir, ["job", T, "nope"]),
    ?assertMatch({match, _}, re:run(E2, "no job \"nope\"")),
    {1, _, E3} = cli(Dir, ["cancel", T, "nope"]),
    ?assertMatch({match, _}, re:run(E3, "no job")),
    {1, _, E4} = cli(Dir, ["workers", <<"no-such-type">>]),
    ?assertMatch({match, _}, re:run(E4, "no registered workers")),
    {1, _, E5} = cli(Dir, ["jobs", <<"no-such-type">>]),
    ?assertMatch({match, _}, re:run(E5, "no jobs of type")),
    {1, _, E6} = cli(Dir, ["jobs", T, "--state", "sleeping"]),
    ?assertMatch({match, _}, re:run(E6, "unknown state")),
    {1, _, E7} = cli(Dir, ["frobnicate"]),
    ?assertMatch({match, _}, re:run(E7, "unknown command")),
    {1, _, E8} = cli(Dir, ["pause", T]),
    ?assertMatch({match, _}, re:run(E8, "not implemented yet")),
    %% Nothing was changed by any of them.
    ?assertMatch({ok, #{state := pending}}, couch_workers:job_get(T, <<"j1">>)).

%% ---- running it ------------------------------------------------------------

%% Runs bin/couch-workers with `--store embedded:Dir'; returns {ExitStatus,
%% Stdout, Stderr}.
cli(Dir, Args) ->
    Err = couch_workers_test_util:tmp_dir() ++ "/stderr",
    Port = open_port(
        {spawn_executable, "/bin/sh"},
        [
            exit_status,
            binary,
            {args, ["-c", "exec \"$0\" \"$@\" 2>\"$ERRF\"", bin(), "--store", "embedded:" ++ Dir | Args]},
            {env, [{"ERRF", Err}]}
        ]
    ),
    {Status, Out} = collect(Port, <<>>),
    {ok, Stderr} = file:read_file(Err),
    {Status, Out, Stderr}.

collect(Port, Acc) ->
    receive
        {Port, {data, D}} -> collect(Port, <<Acc/binary, D/binary>>);
        {Port, {exit_status, S}} -> {S, Acc}
    after 240000 -> erlang:error(cli_timeout)
    end.

%% bin/couch-workers of this checkout: next to the app's directory (rebar
%% 2, a CouchDB tree) or in the working directory (rebar3 runs EUnit at the
%% project's root).
bin() ->
    Candidates = [
        filename:join(code:lib_dir(couch_workers), "bin/couch-workers"),
        filename:absname("bin/couch-workers"),
        filename:absname("../bin/couch-workers")
    ],
    case [C || C <- Candidates, filelib:is_regular(C)] of
        [B | _] -> B;
        [] -> erlang:error({no_bin_couch_workers, Candidates})
    end.
