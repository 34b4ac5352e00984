%% @doc bin/couch-workers on a store that this node (running) uses: what
%% it prints (tables and JSON lines), its actions as the node sees them,
%% and its errors and exit status.
-module(couch_workers_cli_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

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
                    {timeout, 120, {"retry: a failed job back to pending, seen by the node", ?_test(retry(Dir))}},
                    {timeout, 120, {"pause and resume, seen by the node's acceptors", ?_test(pause_resume(Dir))}},
                    {timeout, 120, {"jobs --state: from each state's index, past 10,000 jobs of other states", ?_test(jobs_by_state(Dir))}},
                    {timeout, 120, {"jobs pages: --after the printed cursor, --all", ?_test(jobs_pages(Dir))}},
                    {timeout, 120, {"errors: exit 1 and a reason", ?_test(errors(Dir))}},
                    {timeout, 120, {"schedules, schedule-remove, and each type's leader", ?_test(schedules_and_leaders(Dir))}},
                    {timeout, 120, {"type: shows and sets a job type's settings, seen by the node", ?_test(type_settings(Dir))}}
                ]
            end
        }
    }.

%% ---- tests ---------------------------------------------------------------

type_settings(Dir) ->
    T = unique_type("cli_type"),
    {0, Shown, _} = cli(Dir, ["type", T]),
    ?assertMatch({match, _}, re:run(Shown, <<"\\n", T/binary, " +0 +infinity +infinity +infinity\\n">>)),
    {0, Json, _} = cli(Dir, ["--json", "type", T, "--max-running", "8", "--activity-timeout", "30"]),
    ?assertEqual(
        <<"{\"type\":\"", T/binary, "\",\"running\":0,\"activity_timeout\":30,\"max_running\":8,\"max_running_per_group\":\"infinity\"}\n">>,
        Json
    ),
    ?assertEqual(
        #{activity_timeout => 30, max_running => 8, max_running_per_group => infinity}, couch_workers:job_type_get(T)
    ),
    ok = couch_workers:job_type_set(T, #{max_running_per_group => 2}),
    %% A running job counts.
    ok = couch_workers:job_add(T, <<"r">>, #{}, #{}),
    W0 = couch_workers:worker_register(T, <<"w0">>, #{}, self()),
    {ok, _} = couch_workers:job_accept(W0, #{timeout => 5000}),
    {0, Again, _} = cli(Dir, ["type", T, "--max-running", "infinity"]),
    ?assertMatch({match, _}, re:run(Again, <<"\\n", T/binary, " +1 +30 +infinity +2\\n">>)),
    ok = couch_workers:worker_unregister(W0),
    ok = couch_workers:job_remove(T, <<"r">>),
    %% A job's unique key, in its JSON line (`null` without one).
    ok = couch_workers:job_add(T, <<"u">>, #{}, #{unique => <<"db1">>}),
    {0, UJob, _} = cli(Dir, ["--json", "job", T, "u"]),
    ?assertMatch({match, _}, re:run(UJob, <<"\"unique\":\"db1\"">>)),
    ?assertMatch({match, _}, re:run(UJob, <<"\"history\":\\[\\]">>)),
    %% Its runs: a table after the job's row, or `history' in the JSON line.
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    {ok, _} = couch_workers:job_accept(W, #{}),
    {0, Runs, _} = cli(Dir, ["job", T, "u"]),
    ?assertMatch({match, _}, re:run(Runs, <<"\\nRUN +WORKER.*\\n1 +w +[0-9]+ +- +running +-\\n">>)),
    {0, RunsJson, _} = cli(Dir, ["--json", "job", T, "u"]),
    ?assertMatch({match, _}, re:run(RunsJson, <<"\"history\":\\[\\{\"attempt\":1,\"worker\":\"w\"">>)),
    ok = couch_workers:worker_unregister(W),
    {1, _, Bad} = cli(Dir, ["type", T, "--max-running", "0"]),
    ?assertMatch({match, _}, re:run(Bad, <<"not a positive integer">>)),
    ?assertEqual(
        #{activity_timeout => 30, max_running => infinity, max_running_per_group => 2}, couch_workers:job_type_get(T)
    ).

reads(Dir) ->
    T = unique_type("cli"),
    W = couch_workers:worker_register(T, <<"w1">>, #{slots => 2}, self()),
    [ok = couch_workers:job_add(T, Id, #{<<"n">> => 1}, #{}) || Id <- [<<"j1">>, <<"j2">>, <<"j3">>]],
    {ok, _J} = couch_workers:job_accept(W, #{}),
    %% (The first call may build the binary; the next ones do not.)
    {0, _, _} = cli(Dir, ["status"]),
    {0, Status, Quiet} = cli(Dir, ["status"]),
    ?assertEqual(nomatch, binary:match(Quiet, <<"building">>)),
    ?assertMatch({match, _}, re:run(Status, <<"\\n", T/binary, " +1 +1 ">>)),
    %% scheduled, pending, running, finished, canceled, failed, paused
    ?assertMatch({match, _}, re:run(Status, <<"\\n", T/binary, " +0 +2 +1 +0 +0 +0 +no\\n">>)),
    {0, Json, _} = cli(Dir, ["--json", "workers", T]),
    ?assertMatch({match, _}, re:run(Json, <<"^\\{\"type\":\"", T/binary, "\",\"id\":\"w1\",\"opts\":\\{\"slots\":2\\},\"timeout\":15,\"heartbeat_age_ms\":[0-9]+,\"running\":1,\"leader\":true\\}\\n$">>)),
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

schedules_and_leaders(Dir) ->
    T = unique_type("cli_sched"),
    W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    W2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
    {0, Workers, _} = cli(Dir, ["workers", T]),
    ?assertMatch({match, _}, re:run(Workers, <<"\n", T/binary, " +w1 +15 s +[0-9.]+ s +0 +leader +\\{\\}\n">>)),
    ?assertMatch({match, _}, re:run(Workers, <<"\n", T/binary, " +w2 +15 s +[0-9.]+ s +0 +- +\\{\\}\n">>)),
    {0, Status, _} = cli(Dir, ["--json", "status"]),
    ?assertMatch({match, _}, re:run(Status, <<"\"worker_type\":\"", T/binary, "\",\"workers\":2,[^\n]*\"leader\":\"w1\"">>)),
    ok = couch_workers:worker_unregister(W1),
    {0, Json, _} = cli(Dir, ["--json", "workers", T]),
    ?assertMatch({match, _}, re:run(Json, <<"\"id\":\"w2\",[^\n]*\"leader\":true">>)),
    ok = couch_workers:schedule_set(T, <<"nightly">>, #{cron => <<"30 2 * * *">>}, #{<<"db">> => <<"a">>}, #{}),
    [#{next_run_at := Next}] = couch_workers:schedules(T),
    NextText = list_to_binary(calendar:system_time_to_rfc3339(Next, [{unit, millisecond}, {offset, "Z"}])),
    {0, Table, _} = cli(Dir, ["schedules", T]),
    ?assertMatch({match, _}, re:run(Table, <<"^TYPE +SCHEDULE +NEXT RUN \\(UTC\\) +LAST RUN +SPEC +INFO\n">>)),
    ?assertMatch({match, _}, re:run(Table, <<"\n", T/binary, " +nightly +", NextText/binary, " +- +">>)),
    {0, Line, _} = cli(Dir, ["--json", "schedules", T]),
    ?assertMatch({match, _}, re:run(Line, <<"\"id\":\"nightly\",\"spec\":\\{\"cron\":\"30 2 \\* \\* \\*\"[^\n]*\"next_run_at\":", (integer_to_binary(Next))/binary, ",\"last_run\":null">>)),
    {0, _, _} = cli(Dir, ["schedule-remove", T, "nightly"]),
    ?assertEqual([], couch_workers:schedules(T)),
    {1, _, E} = cli(Dir, ["schedule-remove", T, "nightly"]),
    ?assertMatch({match, _}, re:run(E, <<"no schedule">>)),
    ok = couch_workers:worker_unregister(W2).

errors(Dir) ->
    T = unique_type("cli_err"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Missing = Dir ++ "-nowhere",
    %% (A missing embedded store on either run: an FDB directory is made
    %% when opened.)
    {1, <<>>, E1} = cli_store("embedded:" ++ Missing, ["status"]),
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
    {1, _, E8} = cli(Dir, ["pause", <<"no-such-type">>]),
    ?assertMatch({match, _}, re:run(E8, "no jobs or workers of type")),
    ?assertEqual(false, couch_workers_ops:job_paused(<<"no-such-type">>)),
    {1, _, E9} = cli(Dir, ["retry", T, "j1"]),
    ?assertMatch({match, _}, re:run(E9, "is pending, not failed")),
    {1, _, E10} = cli(Dir, ["retry", T, "nope"]),
    ?assertMatch({match, _}, re:run(E10, "no job \"nope\"")),
    {1, _, E11} = cli(Dir, ["resume"]),
    ?assertMatch({match, _}, re:run(E11, "wrong arguments for resume")),
    %% Nothing was changed by any of them.
    ?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual(false, couch_workers_ops:job_paused(T)).

retry(Dir) ->
    T = unique_type("cli_retry"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"db">> => <<"d1">>}, #{max_attempts => 1}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J, #{<<"reason">> => <<"boom">>}, #{}),
    ?assertMatch({ok, #{state := failed, attempts := 1}}, couch_workers:job_get(T, <<"j1">>)),
    {0, Failed, _} = cli(Dir, ["jobs", T, "--state", "failed"]),
    ?assertMatch({match, _}, re:run(Failed, <<"j1 +failed +- +0 +1 +\\{\"reason\":\"boom\"\\} +\\{\"db\":\"d1\"\\}">>)),
    {0, Out, _} = cli(Dir, ["--json", "retry", T, "j1"]),
    ?assertMatch(<<"{\"type\":\"", _/binary>>, Out),
    ?assertMatch({match, _}, re:run(Out, <<"\"state\":\"pending\".*\"action\":\"retried\"">>)),
    %% Pending again, with its info, no attempts and no error; the node's
    %% worker takes it.
    ?assertMatch(
        {ok, #{state := pending, attempts := 0, error := null, info := #{<<"db">> := <<"d1">>}, max_attempts := 1}},
        couch_workers:job_get(T, <<"j1">>)
    ),
    ?assertMatch(#{failed := 0, pending := 1}, couch_workers:job_counts(T)),
    {ok, J2} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch(#{id := <<"j1">>, attempts := 1}, J2),
    ok = couch_workers:job_finish(J2, #{}),
    %% A finished job is not retried.
    {1, _, E} = cli(Dir, ["retry", T, "j1"]),
    ?assertMatch({match, _}, re:run(E, "is finished, not failed")),
    ok = couch_workers:worker_unregister(W).

pause_resume(Dir) ->
    T = unique_type("cli_pause"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {0, Paused, _} = cli(Dir, ["pause", T]),
    ?assertMatch({match, _}, re:run(Paused, <<"paused +", T/binary, " +yes +not paused">>)),
    ?assertEqual(true, couch_workers_ops:job_paused(T)),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    %% Paused: the node's acceptors keep waiting; adds still work.
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 500})),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    {0, Status, _} = cli(Dir, ["status"]),
    ?assertMatch({match, _}, re:run(Status, <<"\\n", T/binary, " +0 +1 +0 +0 +0 +0 +yes\\n">>)),
    %% An acceptor already waiting gets the job once the command line resumes the type.
    Self = self(),
    Acceptor = spawn_link(fun() -> Self ! {accepted, couch_workers:job_accept(W, #{timeout => 60000})} end),
    timer:sleep(300),
    {0, Resumed, _} = cli(Dir, ["--json", "resume", T]),
    ?assertMatch({match, _}, re:run(Resumed, <<"\"action\":\"resumed\".*\"paused\":false,\"was_paused\":true">>)),
    T0 = erlang:monotonic_time(millisecond),
    receive
        {accepted, Got} -> ?assertMatch({ok, #{id := <<"j1">>}}, Got)
    after 20000 -> erlang:error({no_accept_after_resume, Acceptor})
    end,
    %% Woken by the resume, not by the end of its 60 s wait.
    ?assert(erlang:monotonic_time(millisecond) - T0 < 20000),
    ?assertEqual(false, couch_workers_ops:job_paused(T)),
    ok = couch_workers:worker_unregister(W).

jobs_by_state(Dir) ->
    T = unique_type("cli_state"),
    %% 10,000 pending jobs before the failed one in id order: a scan of
    %% the type's records (what the command line did before, 10,000 at
    %% most) found no failed job; each state's index finds it at once.
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"z1">>, #{}, #{priority => -1}),
    {ok, #{id := <<"z1">>} = J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J, #{<<"reason">> => <<"bad">>}, #{retry => false}),
    ok = couch_workers:job_add_many(T, [{iolist_to_binary(io_lib:format("a~5..0b", [I])), #{}, #{}} || I <- lists:seq(1, 10000)]),
    {0, Failed, _} = cli(Dir, ["--json", "jobs", T, "--state", "failed"]),
    ?assertMatch([<<"{\"type\":", _/binary>>], binary:split(Failed, <<"\n">>, [global, trim_all])),
    ?assertMatch({match, _}, re:run(Failed, <<"\"id\":\"z1\",\"state\":\"failed\".*\"error\":\\{\"reason\":\"bad\"\\}">>)),
    %% Pages in id order say when more follow.
    {0, Two, _} = cli(Dir, ["jobs", T, "--state", "pending", "--limit", "2"]),
    ?assertMatch({match, _}, re:run(Two, <<"a00001 +pending.*\\n.*a00002 +pending.*\\n\\n\\(more follow: --after 613030303032\\)\\n$">>, [dotall])),
    {0, Both, _} = cli(Dir, ["--json", "jobs", T, "--state", "failed", "--state", "pending", "--limit", "1000"]),
    %% 1000 jobs, then the next page's cursor
    ?assertEqual(1001, length(binary:split(Both, <<"\n">>, [global, trim_all]))),
    ?assertMatch({match, _}, re:run(Both, <<"\n\\{\"next\":\"613031303030\"\\}\n$">>)),
    ?assertEqual(nomatch, binary:match(Both, <<"\"z1\"">>)),
    ok = couch_workers:job_remove(T, <<"z1">>),
    ok = couch_workers:worker_unregister(W).

jobs_pages(Dir) ->
    T = unique_type("cli_page"),
    %% Ids of any bytes (a zero byte, one that is not UTF-8) page too.
    Ids = lists:sort([iolist_to_binary(io_lib:format("j~2..0b", [I])) || I <- lists:seq(1, 23)] ++ [<<"j05", 0, 255>>]),
    ok = couch_workers:job_add_many(T, [{Id, #{}, #{}} || Id <- Ids]),
    %% Page by page, each starting after the cursor the last one printed:
    %% every job once, in id order, and the last page prints no cursor.
    Pages = pages(Dir, T, ["--limit", "5"], []),
    ?assertEqual([5, 5, 5, 5, 4], [length(P) || P <- Pages]),
    ?assertEqual(Ids, lists:append(Pages)),
    %% --all: every page in one command, the same jobs, no cursor printed.
    {0, All, _} = cli(Dir, ["--json", "jobs", T, "--all", "--limit", "7"]),
    ?assertEqual({Ids, none}, ids_and_next(All)),
    {0, AllPending, _} = cli(Dir, ["--json", "jobs", T, "--all", "--state", "pending", "--limit", "2"]),
    ?assertEqual({Ids, none}, ids_and_next(AllPending)),
    %% Past the last id: an empty page, not an error.
    {0, Past, _} = cli(Dir, ["--json", "jobs", T, "--after", "ff"]),
    ?assertEqual(<<>>, Past),
    {1, _, E1} = cli(Dir, ["jobs", T, "--after", "xyz"]),
    ?assertMatch({match, _}, re:run(E1, "is not a cursor")),
    {1, _, E2} = cli(Dir, ["jobs", T, "--after", "00", "--all"]),
    ?assertMatch({match, _}, re:run(E2, "not together")),
    [ok = couch_workers:job_remove(T, Id) || Id <- Ids].

%% Every page of `jobs T Args' as lists of ids, following the cursors.
pages(Dir, T, Args, Acc) ->
    After = case Acc of
        [] -> [];
        [{_, Cursor} | _] -> ["--after", Cursor]
    end,
    {0, Out, _} = cli(Dir, ["--json", "jobs", T | Args ++ After]),
    case ids_and_next(Out) of
        {Page, none} -> [P || {P, _} <- lists:reverse([{Page, none} | Acc])];
        {Page, Next} -> pages(Dir, T, Args, [{Page, Next} | Acc])
    end.

%% The ids of a `--json jobs' output (ids decoded from the JSON strings
%% the command prints: U+FFFD for a byte that is not UTF-8, restored here
%% from the test's own ids) and its cursor, `none' when it printed none.
ids_and_next(Out) ->
    Lines = binary:split(Out, <<"\n">>, [global, trim_all]),
    lists:foldr(
        fun(Line, {Ids, Next}) ->
            case re:run(Line, <<"^\\{\"next\":\"([0-9a-f]+)\"\\}$">>, [{capture, all_but_first, binary}]) of
                {match, [Cursor]} ->
                    none = Next,
                    {Ids, binary_to_list(Cursor)};
                nomatch ->
                    {match, [Id]} = re:run(Line, <<"\"id\":\"([^\"]*)\"">>, [{capture, all_but_first, binary}]),
                    {[restore_id(Id) | Ids], Next}
            end
        end,
        {[], none},
        Lines
    ).

%% The one id the command cannot print as it is (JSON: \u0000 and U+FFFD).
restore_id(<<"j05\\u0000", 16#ef, 16#bf, 16#bd>>) -> <<"j05", 0, 255>>;
restore_id(Id) -> Id.

%% ---- running it ------------------------------------------------------------

%% Runs bin/couch-workers on the store this node's app runs on for `Dir'
%% (`embedded:Dir', or on FoundationDB the app's test directory); returns
%% {ExitStatus, Stdout, Stderr}.
cli(Dir, Args) ->
    cli_store(store_arg(Dir), Args).

cli_store(Store, Args) ->
    Err = couch_workers_test_util:tmp_dir() ++ "/stderr",
    Port = open_port(
        {spawn_executable, "/bin/sh"},
        [
            exit_status,
            binary,
            {args, ["-c", "exec \"$0\" \"$@\" 2>\"$ERRF\"", bin(), "--store", Store | Args]},
            {env, [{"ERRF", Err}]}
        ]
    ),
    {Status, Out} = collect(Port, <<>>),
    {ok, Stderr} = file:read_file(Err),
    {Status, Out, Stderr}.

store_arg(Dir) ->
    case couch_workers_test_util:test_store(os:getenv("FDB_CLUSTER_FILE"), Dir, filename:basename(Dir)) of
        {embedded, _} -> "embedded:" ++ Dir;
        {fdb_test, File, Name} -> "fdb-test:" ++ Name ++ ":" ++ File
    end.

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
