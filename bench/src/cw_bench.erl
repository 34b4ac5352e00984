%% @doc The benchmark controller (run by bench/run). Runs each workload in
%% a fresh `erl' VM (cw_bench_wl:child/1) on a fresh store directory, and
%% the store's raw commit rate with a Rust example binary; prints one JSON
%% line per result on standard output (progress and anything else on
%% standard error). With `--runs N' every workload runs N times (run 1 of
%% every workload, then run 2, ...) and the printed figures are the
%% medians, field by field; each run's lines go to bench/out/runs.jsonl.
%% With `--store fdb:ClusterFile' the workloads' VMs run on FoundationDB
%% (each workload on a directory of its own, couch_workers_test/<name>,
%% every node of it on the same one), and every line says its store.
-module(cw_bench).

-export([main/1]).

-define(ALL, ["commit_rate", "handoff", "core", "J1", "J1b", "J2", "J2n", "J2t0", "J2l8", "J2f", "J3", "J4", "J5", "M1", "M2", "M2r", "M3", "M4", "M4core", "I1", "I2", "H1", "J3x"]).
%% Extra workloads, run only when named with --only.
-define(EXTRA, ["sqlite_shapes", "J2sqlite", "J2x"]).
%% What --store fdb runs by default.
-define(FDB_DEFAULT, ["J1", "J1b", "J2", "J2n", "J3", "M2", "M3", "J2x"]).
%% Rust programs on the embedded store (no NIF, no app env `store').
-define(EMBEDDED_ONLY, ["commit_rate", "handoff", "core", "M4core", "H1", "sqlite_shapes", "J2sqlite"]).
-define(CHILD_TIMEOUT_MS, 30 * 60 * 1000).

-spec main([string()]) -> ok.
main(Args) ->
    Opts =
        try
            check(parse(Args, #{runs => 1, smoke => false, only => default, j4_large => undefined, erl_flags => [], app_env => [], store => embedded}))
        catch
            throw:{usage, Msg} ->
                io:format(standard_error, "bench/run: ~s~n", [Msg]),
                erlang:halt(2)
        end,
    Code =
        try
            run(Opts)
        catch
            Class:Reason:Stack ->
                io:format(standard_error, "bench/run: ~p:~p~n~p~n", [Class, Reason, Stack]),
                1
        end,
    %% init:stop/1 (not erlang:halt/1): standard output is flushed first.
    init:stop(Code).

parse([], Opts) ->
    Opts;
parse(["--store", "embedded" | R], Opts) ->
    parse(R, Opts#{store => embedded});
parse(["--store", "fdb:" ++ File | R], Opts) when File =/= "" ->
    case filelib:is_regular(File) of
        true -> parse(R, Opts#{store => {fdb, filename:absname(File)}});
        false -> throw({usage, "--store fdb:FILE: no cluster file " ++ File})
    end;
parse(["--store", Other | _], _Opts) ->
    throw({usage, "--store takes embedded or fdb:CLUSTER_FILE (bench/run starts a cluster for a bare fdb), not " ++ Other});
parse(["--smoke" | R], Opts) ->
    parse(R, Opts#{smoke => true});
parse(["--runs", N | R], Opts) ->
    case string:to_integer(N) of
        {I, ""} when I > 0 -> parse(R, Opts#{runs => I});
        _ -> throw({usage, "--runs takes a positive integer"})
    end;
parse(["--only", List | R], Opts) ->
    Names = string:lexemes(List, ","),
    [throw({usage, "unknown workload " ++ W}) || W <- Names, not lists:member(W, ?ALL ++ ?EXTRA)],
    parse(R, Opts#{only => Names});
parse(["--j4-large", N | R], Opts) ->
    case string:to_integer(N) of
        {I, ""} when I > 0 -> parse(R, Opts#{j4_large => I});
        _ -> throw({usage, "--j4-large takes a positive integer"})
    end;
parse(["--app-env", KVs | R], Opts) ->
    Env = [
        case string:split(KV, "=") of
            [K, V] ->
                {list_to_atom(K),
                    case string:to_integer(V) of
                        {I, ""} -> I;
                        _ -> list_to_atom(V)
                    end};
            _ ->
                throw({usage, "--app-env takes Key=Value[,Key=Value...]"})
        end
     || KV <- string:lexemes(KVs, ",")
    ],
    parse(R, Opts#{app_env => Env});
parse(["--erl-flags", Flags | R], Opts) ->
    parse(R, Opts#{erl_flags => string:lexemes(Flags, " ")});
parse([Other | _], _Opts) ->
    throw({usage, "unknown argument " ++ Other}).

check(#{only := default, store := embedded} = Opts) ->
    Opts#{only => ?ALL};
check(#{only := default} = Opts) ->
    Opts#{only => ?FDB_DEFAULT};
check(#{only := Only, store := {fdb, _}} = Opts) ->
    case [W || W <- Only, lists:member(W, ?EMBEDDED_ONLY)] of
        [] -> Opts;
        Bad -> throw({usage, "on the embedded store only (Rust programs without the app): " ++ lists:join(",", Bad)})
    end;
check(Opts) ->
    Opts.

run(#{runs := Runs, only := Only} = Opts) ->
    Order = [W || W <- ?ALL ++ ?EXTRA, lists:member(W, Only)],
    RunsFile = filename:join(out_dir(), "runs.jsonl"),
    ok = filelib:ensure_dir(RunsFile),
    {ok, RunsIo} = file:open(RunsFile, [write]),
    Machine = machine(Opts),
    io:format(RunsIo, "~s~n", [cw_bench_json:encode(Machine)]),
    Results = lists:append(lists:append([
        [
            begin
                Lines = [maps:merge(#{store => embedded}, L) || L <- run_one(W, params(W, Opts), Opts)],
                [
                    begin
                        Line = cw_bench_json:encode(L#{run => R}),
                        %% (the lines of the Rust programs get their store here)
                        io:format(standard_error, "[run ~b/~b] ~s~n", [R, Runs, Line]),
                        io:format(RunsIo, "~s~n", [Line])
                    end
                 || L <- Lines
                ],
                Lines
            end
         || W <- Order
        ]
     || R <- lists:seq(1, Runs)
    ])),
    ok = file:close(RunsIo),
    Failed = [R || R <- Results, is_map_key(error, R)],
    Good = [R || R <- Results, not is_map_key(error, R)],
    Durability = durability(Results, Opts),
    io:format("~s~n", [cw_bench_json:encode(Machine#{loadavg_end => loadavg()})]),
    io:format("~s~n", [cw_bench_json:encode(Durability)]),
    Final = summarize(Good, Runs),
    [io:format("~s~n", [cw_bench_json:encode(F)]) || F <- Final],
    [io:format("~s~n", [cw_bench_json:encode(F)]) || F <- Failed],
    case Failed of
        [] ->
            0;
        _ ->
            io:format(standard_error, "bench/run: ~b result(s) failed (not a speed threshold: the workload could not run):~n", [
                length(Failed)
            ]),
            [io:format(standard_error, "  ~s: ~s~n", [maps:get(workload, F), maps:get(error, F)]) || F <- Failed],
            1
    end.

%% ---- sizes -------------------------------------------------------------------

params(W, #{smoke := Smoke, app_env := AppEnv, store := Store} = Opts) ->
    Base = #{tmp => tmp_base(), app_env => AppEnv, store => Store},
    maps:merge(Base, sizes(W, Smoke, Opts)).

sizes("commit_rate", true, _) -> #{seconds => 1};
sizes("commit_rate", false, _) -> #{seconds => 3};
sizes("handoff", true, _) -> #{calls => 2000};
sizes("handoff", false, _) -> #{calls => 20000};
sizes("sqlite_shapes", true, _) -> #{seconds => 1};
sizes("sqlite_shapes", false, _) -> #{seconds => 2};
sizes("J2sqlite", true, _) -> #{jobs => 1000};
sizes("J2sqlite", false, _) -> #{jobs => 20000};
sizes("core", true, _) -> #{jobs => 1000};
sizes("core", false, _) -> #{jobs => 20000};
sizes("J1", true, _) -> #{jobs => 1000};
sizes("J1", false, _) -> #{jobs => 20000};
sizes("J1b", true, _) -> #{jobs => 1000, batch => 100};
sizes("J1b", false, _) -> #{jobs => 20000, batch => 100};
sizes("J2", true, _) -> #{jobs => 1000, workers => 8};
sizes("J2", false, _) -> #{jobs => 20000, workers => 8};
sizes("J2n", true, _) -> #{jobs => 1000, workers => 8};
sizes("J2n", false, _) -> #{jobs => 20000, workers => 8};
sizes("J2t0", true, _) -> #{jobs => 1000, workers => 8};
sizes("J2t0", false, _) -> #{jobs => 20000, workers => 8};
sizes("J2l8", true, _) -> #{jobs => 1000, workers => 8};
sizes("J2l8", false, _) -> #{jobs => 20000, workers => 8};
sizes("J2f", true, _) -> #{jobs => 1000, workers => 8};
sizes("J2f", false, _) -> #{jobs => 20000, workers => 8};
sizes("J5", true, _) -> #{jobs => 1000, spread_ms => 500, workers => 8};
sizes("J5", false, _) -> #{jobs => 10000, spread_ms => 10000, workers => 8};
sizes("J3", true, _) -> #{jobs => 100, interval_ms => 10};
sizes("J3", false, _) -> #{jobs => 500, interval_ms => 10};
sizes("J4", Smoke, #{j4_large := Large}) ->
    L =
        case {Large, Smoke} of
            {undefined, true} -> 10000;
            {undefined, false} -> 1000000;
            {N, _} -> N
        end,
    #{sizes => [1000, L], samples => case Smoke of true -> 50; false -> 200 end};
sizes("M1", true, _) -> #{workers => 200};
sizes("M1", false, _) -> #{workers => 1000};
sizes("M2", true, _) -> #{joins => 20};
sizes("M2", false, _) -> #{joins => 200};
sizes("M2r", true, _) -> #{joins => 20};
sizes("M2r", false, _) -> #{joins => 200};
sizes("M3", true, _) -> #{repeats => 1, timeout_s => 3};
sizes("M3", false, _) -> #{repeats => 5, timeout_s => 3};
sizes("M4", true, _) -> #{sizes => [100, 1000], changes => 10};
sizes("M4", false, _) -> #{sizes => [100, 10000], changes => 20};
sizes("M4core", true, _) -> #{sizes => [100, 1000], changes => 10};
sizes("M4core", false, _) -> #{sizes => [100, 10000], changes => 20};
sizes("I1", true, _) -> #{seconds => 1};
sizes("I1", false, _) -> #{seconds => 60};
sizes("I2", true, _) -> #{seconds => 1};
sizes("I2", false, _) -> #{seconds => 60};
sizes("J2x", true, _) -> #{jobs => 1000, workers => 4, nodes => [1, 2, 4]};
sizes("J2x", false, _) -> #{jobs => 10000, workers => 4, nodes => [1, 2, 4]};
sizes("J3x", true, _) -> #{jobs => 100, interval_ms => 10};
sizes("J3x", false, _) -> #{jobs => 500, interval_ms => 10};
sizes("H1", true, _) -> #{workers => 1000, seconds => 2};
sizes("H1", false, _) -> #{workers => 10000, seconds => 20}.

%% ---- running one workload ------------------------------------------------------

run_one("commit_rate", Params, _Opts) ->
    commit_rate(Params);
run_one("core", Params, _Opts) ->
    core_example(Params);
run_one("handoff", #{calls := Calls}, _Opts) ->
    example_lines(os:cmd(example_bin("cw_handoff") ++ " " ++ integer_to_list(Calls) ++ " 2>&1"), <<"handoff">>);
run_one("M4core", Params, _Opts) ->
    m4_core(Params);
run_one("H1", Params, _Opts) ->
    h1(Params);
run_one("sqlite_shapes", #{seconds := Secs, tmp := Tmp}, _Opts) ->
    Dir = filename:join(Tmp, "cw_bench_shapes_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    Out = os:cmd(example_bin("cw_sqlite_shapes") ++ " " ++ Dir ++ " " ++ integer_to_list(Secs) ++ " 2>&1"),
    _ = file:del_dir_r(Dir),
    example_lines(Out, <<"sqlite_shapes">>);
run_one("J2sqlite", #{jobs := N}, _Opts) ->
    %% SQLite's own time for J2's writes (bench/sqlite_replay.sh: a traced
    %% J2 on the core, replayed on bare SQLite); it builds its traced
    %% binaries (a check that they are up to date once built).
    Script = filename:join([repo_root(), "bench", "sqlite_replay.sh"]),
    example_lines(os:cmd(Script ++ " --jobs " ++ integer_to_list(N)), <<"J2sqlite">>);
run_one("M4", #{sizes := Sizes} = Params, Opts) ->
    %% One VM per size, so that a VM that crashes at one size (see
    %% bench/RESULTS.md: memberships over 128 workers) does not take the
    %% other size's figures with it.
    Rows = [{Size, run_child("M4", Params#{sizes => [Size]}, Opts)} || Size <- Sizes],
    m4_combine(Sizes, Params, Rows);
run_one(W, Params, Opts) ->
    run_child(W, Params, Opts).

m4_combine(Sizes, #{changes := K}, Rows) ->
    Good = [{Size, Row} || {Size, [#{rows := [Row]}]} <- Rows],
    Bad = [
        #{members => Size, error => maps:get(error, R, <<"no result">>)}
     || {Size, Res} <- Rows, R <- [case Res of [X | _] -> X; [] -> #{} end], not is_map_key(rows, R)
    ],
    Base = #{workload => 'M4', sizes => Sizes, changes => K, rows => [Row || {_, Row} <- Good]},
    Dur = [D || {_, [#{durability := D} | _]} <- Rows],
    Base1 = case Dur of [D | _] -> Base#{durability => D}; [] -> Base end,
    case {Bad, Good} of
        {[], [{_, Small} | _]} ->
            {_, Large} = lists:last(Good),
            Ratio = fun(Key) -> maps:get(Key, Large) / max(1.0e-9, maps:get(Key, Small)) end,
            [Base1#{
                p50_ratio => Ratio(p50_ms),
                cpu_per_change_ratio => Ratio(cpu_ms_per_change),
                size_ratio => lists:last(Sizes) / hd(Sizes)
            }];
        _ ->
            [Base1#{error => iolist_to_binary(io_lib:format("~0p", [Bad])), failed_sizes => Bad}]
    end.

run_child(W, #{tmp := Tmp} = Params, #{erl_flags := Flags}) ->
    %% The child's store directories go under a directory of this run,
    %% removed here whatever happened to the child (a crashed VM cleans
    %% nothing up).
    Base = filename:join(Tmp, "cw_bench_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = filelib:ensure_dir(filename:join(Base, "x")),
    Erl = os:find_executable("erl"),
    Args =
        ["-noshell", "-pa", app_ebin(), "-pa", bench_ebin()] ++ Flags ++
            ["-run", "cw_bench_wl", "child", W, lists:flatten(io_lib:format("~0p", [Params#{tmp => Base}]))],
    Port = open_port({spawn_executable, Erl}, [{args, Args}, {line, 1 bsl 20}, exit_status, stderr_to_stdout, binary]),
    Deadline = erlang:monotonic_time(millisecond) + ?CHILD_TIMEOUT_MS,
    try
        collect(Port, W, Deadline, [], <<>>)
    after
        _ = file:del_dir_r(Base)
    end.

collect(Port, W, Deadline, Acc, Partial) ->
    Left = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {Port, {data, {noeol, Chunk}}} ->
            collect(Port, W, Deadline, Acc, <<Partial/binary, Chunk/binary>>);
        {Port, {data, {eol, Chunk}}} ->
            Line = <<Partial/binary, Chunk/binary>>,
            case Line of
                <<"CWBENCH ", Term/binary>> ->
                    collect(Port, W, Deadline, [parse_term(Term) | Acc], <<>>);
                _ ->
                    io:format(standard_error, "  [~s] ~s~n", [W, Line]),
                    collect(Port, W, Deadline, Acc, <<>>)
            end;
        {Port, {exit_status, 0}} ->
            lists:reverse(Acc);
        {Port, {exit_status, Status}} ->
            case Acc of
                [] -> [#{workload => list_to_binary(W), error => exit_reason(Status)}];
                _ -> lists:reverse(Acc)
            end
    after Left ->
        catch port_close(Port),
        [#{workload => list_to_binary(W), error => <<"timeout">>}]
    end.

exit_reason(Status) when Status > 128 ->
    Sig = Status - 128,
    Name = proplists:get_value(Sig, [{6, "SIGABRT"}, {9, "SIGKILL"}, {11, "SIGSEGV"}, {7, "SIGBUS"}], "signal"),
    iolist_to_binary(io_lib:format("the VM crashed: exit status ~b (~s, signal ~b)", [Status, Name, Sig]));
exit_reason(Status) ->
    iolist_to_binary(io_lib:format("exit status ~b", [Status])).

parse_term(Bin) ->
    {ok, Toks, _} = erl_scan:string(binary_to_list(Bin) ++ "."),
    {ok, T} = erl_parse:parse_term(Toks),
    T.

%% The store's raw commit rate: empty-ish write transactions (one small
%% key) per second, by the Rust example cw_commit_rate on the core crate
%% (no NIF call exposes a bare commit). Lines are flat JSON objects.
commit_rate(#{seconds := Secs, tmp := Tmp}) ->
    Bin = example_bin("cw_commit_rate"),
    Dir = filename:join(Tmp, "cw_bench_commit_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    Out = os:cmd(Bin ++ " " ++ Dir ++ " " ++ integer_to_list(Secs) ++ " 2>&1"),
    _ = file:del_dir_r(Dir),
    example_lines(Out, <<"commit_rate">>).

%% The job queue driven from Rust on the core crate, no NIF: the same
%% J1/J1b/J2 shapes, for the profile (what the core allows by itself).
core_example(#{jobs := N, tmp := Tmp}) ->
    Bin = example_bin("cw_core_jobs"),
    Dir = filename:join(Tmp, "cw_bench_core_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    Out = os:cmd(Bin ++ " " ++ Dir ++ " " ++ integer_to_list(N) ++ " 2>&1"),
    _ = file:del_dir_r(Dir),
    example_lines(Out, <<"core">>).

%% M4 on the core crate, no NIF (the Rust example cw_membership): the
%% store work of one membership change at each size.
m4_core(#{sizes := Sizes, changes := K, tmp := Tmp}) ->
    Bin = example_bin("cw_membership"),
    Dir = filename:join(Tmp, "cw_bench_m4core_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    SizeArg = lists:join(",", [integer_to_list(S) || S <- Sizes]),
    Out = os:cmd(Bin ++ " " ++ Dir ++ " " ++ SizeArg ++ " " ++ integer_to_list(K) ++ " 2>&1"),
    _ = file:del_dir_r(Dir),
    example_lines(Out, <<"M4core">>).

%% H1: store commits and heartbeat transactions per second with
%% many workers on two nodes, by the Rust example cw_heartbeats (two store
%% handles on one directory; no NIF call counts the store's commits).
h1(#{workers := N, seconds := Secs, tmp := Tmp}) ->
    Bin = example_bin("cw_heartbeats"),
    Dir = filename:join(Tmp, "cw_bench_h1_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))),
    Out = os:cmd(Bin ++ " " ++ Dir ++ " " ++ integer_to_list(N) ++ " " ++ integer_to_list(Secs) ++ " 2>&1"),
    _ = file:del_dir_r(Dir),
    example_lines(Out, <<"H1">>).

example_lines(Out, W) ->
    Lines = [L || L <- string:split(Out, "\n", all), L =/= ""],
    Parsed = [decode_flat(L) || L <- Lines, hd(L) =:= ${],
    [io:format(standard_error, "  [~s] ~s~n", [W, L]) || L <- Lines, hd(L) =/= ${],
    case Parsed of
        [] -> [#{workload => W, error => iolist_to_binary(["no result: ", Out])}];
        _ -> Parsed
    end.

example_bin(Name) ->
    case os:getenv("CW_BENCH_TARGET_DIR") of
        false -> filename:join([repo_root(), "target", "release", "examples", Name]);
        Dir -> filename:join([Dir, "release", "examples", Name])
    end.

%% A flat JSON object of strings, numbers, booleans and null (what the
%% Rust examples print).
decode_flat(Line) ->
    {ok, Toks} = flat_tokens(string:trim(Line), []),
    pairs(Toks, #{}).

pairs(['{' | R], M) -> pairs(R, M);
pairs(['}'], M) -> M;
pairs([',' | R], M) -> pairs(R, M);
pairs([{str, K}, ':', V | R], M) -> pairs(R, M#{binary_to_atom(K, utf8) => unstr(V)}).

unstr({str, S}) -> S;
unstr(V) -> V.

flat_tokens([], Acc) ->
    {ok, lists:reverse(Acc)};
flat_tokens([C | R], Acc) when C =:= ${; C =:= $}; C =:= $:; C =:= $, ->
    flat_tokens(R, [list_to_atom([C]) | Acc]);
flat_tokens([$\s | R], Acc) ->
    flat_tokens(R, Acc);
flat_tokens([$" | R], Acc) ->
    {S, R1} = flat_string(R, []),
    flat_tokens(R1, [{str, unicode:characters_to_binary(S)} | Acc]);
flat_tokens("true" ++ R, Acc) ->
    flat_tokens(R, [true | Acc]);
flat_tokens("false" ++ R, Acc) ->
    flat_tokens(R, [false | Acc]);
flat_tokens("null" ++ R, Acc) ->
    flat_tokens(R, [null | Acc]);
flat_tokens(S, Acc) ->
    {Num, R} = lists:splitwith(fun(C) -> lists:member(C, "0123456789+-.eE") end, S),
    V =
        case string:to_float(Num) of
            {F, ""} -> F;
            _ -> list_to_integer(Num)
        end,
    flat_tokens(R, [V | Acc]).

flat_string([$\\, C | R], Acc) -> flat_string(R, [C | Acc]);
flat_string([$" | R], Acc) -> {lists:reverse(Acc), R};
flat_string([C | R], Acc) -> flat_string(R, [C | Acc]).

%% ---- summaries ---------------------------------------------------------------

%% One line per (workload, variant): with one run as measured, with more
%% the median of every numeric field (lists of rows: row by row).
summarize(Results, 1) ->
    [maps:remove(durability, R) || R <- Results];
summarize(Results, _Runs) ->
    Keys = lists:usort([key(R) || R <- Results]),
    [
        begin
            Group = [maps:remove(durability, R) || R <- Results, key(R) =:= K],
            (median_map(Group))#{runs => length(Group)}
        end
     || K <- order_keys(Keys, Results)
    ].

%% Keep the order in which the workloads ran.
order_keys(_Keys, Results) ->
    lists:foldl(
        fun(R, Acc) ->
            K = key(R),
            case lists:member(K, Acc) of
                true -> Acc;
                false -> Acc ++ [K]
            end
        end,
        [],
        Results
    ).

key(R) -> {maps:get(workload, R), maps:get(variant, R, none)}.

median_map([First | _] = Maps) ->
    maps:map(
        fun(K, V) ->
            Vs = [maps:get(K, M, V) || M <- Maps],
            median_value(K, V, Vs)
        end,
        maps:remove(run, First)
    ).

median_value(_K, V, Vs) when is_number(V) ->
    median([X || X <- Vs, is_number(X)]);
median_value(samples_ms, [N | _], Vs) when is_number(N) ->
    %% M3's samples: every run's, together.
    lists:append([L || L <- Vs, is_list(L)]);
median_value(_K, [M | _] = V, Vs) when is_map(M) ->
    %% Rows: the median of each row across runs.
    Rows = length(V),
    [median_map([lists:nth(I, L) || L <- Vs, is_list(L), length(L) =:= Rows]) || I <- lists:seq(1, Rows)];
median_value(_K, V, _Vs) ->
    V.

median(Xs) ->
    S = lists:sort(Xs),
    N = length(S),
    case N rem 2 of
        1 -> lists:nth((N + 1) div 2, S);
        0 ->
            case {lists:nth(N div 2, S), lists:nth(N div 2 + 1, S)} of
                {A, A} -> A;
                {A, B} -> (A + B) / 2
            end
    end.

durability(Results, #{store := Store}) ->
    Ds = lists:usort([
        D
     || R <- Results,
        not lists:member(maps:get(workload, R), [<<"commit_rate">>, <<"core">>, <<"M4core">>, <<"sqlite_shapes">>, <<"sqlite_replay">>, <<"handoff">>]),
        D <- [maps:get(durability, R, null)],
        D =/= null
    ]),
    Fallback = lists:usort([D || #{workload := <<"commit_rate">>, durability := D} <- Results]),
    #{
        workload => durability,
        store => store_name(Store),
        durability =>
            case Ds of
                [D] -> D;
                [] -> null;
                Many -> Many
            end,
        source =>
            <<"the store's own Database::durability() string, from its store_opened log event in each "
              "benchmark VM (default EmbeddedOptions: synchronous=NORMAL)">>,
        commit_rate_durability => Fallback
    }.

store_name(embedded) -> embedded;
store_name({fdb, _}) -> fdb.

machine(#{runs := Runs, smoke := Smoke, erl_flags := Flags, app_env := AppEnv, store := Store}) ->
    Cpu =
        case file:read_file("/proc/cpuinfo") of
            {ok, Info} ->
                case re:run(Info, "model name\\s*:\\s*([^\n]*)", [{capture, [1], binary}]) of
                    {match, [M]} -> M;
                    nomatch -> <<"unknown">>
                end;
            _ ->
                <<"unknown">>
        end,
    #{
        workload => machine,
        nproc => nproc(),
        cpu => Cpu,
        otp => list_to_binary(erlang:system_info(otp_release)),
        erts => list_to_binary(erlang:system_info(version)),
        schedulers => erlang:system_info(schedulers_online),
        runs => Runs,
        mode =>
            case Smoke of
                true -> smoke;
                false -> full
            end,
        erl_flags => list_to_binary(lists:join(" ", Flags)),
        store => store_name(Store),
        cluster_file => case Store of {fdb, File} -> list_to_binary(File); embedded -> null end,
        %% The machine's load when the run began (other work on it moves
        %% every figure): /proc/loadavg's 1, 5 and 15 minute averages.
        loadavg => loadavg(),
        app_env => iolist_to_binary(lists:join(",", [io_lib:format("~s=~p", [K, V]) || {K, V} <- AppEnv]))
    }.

loadavg() ->
    case file:read_file("/proc/loadavg") of
        {ok, B} -> iolist_to_binary(lists:join(" ", lists:sublist(string:lexemes(B, " \n"), 3)));
        _ -> null
    end.

nproc() ->
    case string:to_integer(string:trim(os:cmd("nproc"))) of
        {N, _} when is_integer(N) -> N;
        _ -> erlang:system_info(logical_processors_available)
    end.

%% ---- paths -------------------------------------------------------------------

repo_root() ->
    case os:getenv("CW_BENCH_ROOT") of
        false -> filename:dirname(filename:dirname(filename:dirname(bench_ebin())));
        Root -> Root
    end.

bench_ebin() ->
    filename:dirname(code:which(?MODULE)).

out_dir() ->
    filename:dirname(bench_ebin()).

app_ebin() ->
    filename:join([repo_root(), "_build", "default", "lib", "couch_workers", "ebin"]).

tmp_base() ->
    case os:getenv("CW_BENCH_TMP") of
        false -> "/tmp";
        T -> T
    end.
