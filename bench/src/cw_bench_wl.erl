%% @doc The benchmark's workloads. Each runs in a fresh `erl' VM (started
%% by `cw_bench', the controller) on a fresh temporary store directory,
%% through the public Erlang API of couch_workers only, and prints its
%% result as one line `CWBENCH <Erlang term>' on standard output, which
%% the controller turns into JSON.
%%
%% This module is the child VM's entry, the app on a fresh store, peers
%% and the helpers the workloads share; the workloads are one module per
%% family: `cw_bench_wl_jobs' (J*), `cw_bench_wl_members' (M*),
%% `cw_bench_wl_idle' (I1, I2), `cw_bench_scale' (J3x, across nodes).
%%
%% Clocks: latencies within one VM use erlang:monotonic_time/1. Latencies
%% across two VMs on one host (M2) use os:system_time(microsecond), the
%% OS wall clock (CLOCK_REALTIME), read by both VMs; erlang:system_time/1
%% is not used across VMs because each VM applies its own time offset.
-module(cw_bench_wl).

-export([child/1, run/2]).
%% logger handler (captures the store's durability string)
-export([log/2]).
%% shared with the workload modules
-export([start_app/1, stop_app/1, start_peer/1, stop_peer/1, store/1, store_name/0]).
-export([now_us/0, rate/2, pct/2, by_size/3, job_id/1, worker_id/1, field/2]).

-spec start_app(map()) -> file:filename().
-spec stop_app(file:filename()) -> ok.
-spec start_peer(file:filename()) -> {pid(), string()}.
-spec store(file:filename()) -> tuple().
-spec store_name() -> embedded | fdb.
-spec stop_peer(pid()) -> ok.
-spec now_us() -> integer().
-spec rate(non_neg_integer(), number()) -> float().
-spec pct([number()], number()) -> number().
-spec by_size(map(), [map(), ...], [{atom(), atom()}]) -> map().
-spec job_id(integer()) -> binary().
-spec worker_id(integer()) -> binary().
-spec field(atom(), map()) -> term().

-define(RESULT_TAG, "CWBENCH ").
-define(PEER_TIMEOUT, 30000).

%% ---- entry point in the child VM ------------------------------------------

%% `erl -run cw_bench_wl child Workload ParamsTerm'
-spec child([string()]) -> no_return().
child([Workload, ParamsStr]) ->
    Params = parse_term(ParamsStr),
    %% The store every node of this VM's workload opens (see store/1).
    persistent_term:put(cw_bench_store, maps:get(store, Params, embedded)),
    Code =
        try run(list_to_atom(Workload), Params) of
            Results ->
                [emit(R) || R <- Results],
                0
        catch
            Class:Reason:Stack ->
                emit(#{
                    workload => list_to_binary(Workload),
                    error => iolist_to_binary(io_lib:format("~0p:~0p", [Class, Reason])),
                    stack => iolist_to_binary(io_lib:format("~0p", [lists:sublist(Stack, 5)]))
                }),
                1
        end,
    %% Leave no store or peer behind; halt without waiting for the app.
    erlang:halt(Code).

parse_term(S) ->
    {ok, Toks, _} = erl_scan:string(S ++ "."),
    {ok, T} = erl_parse:parse_term(Toks),
    T.

emit(Result0) ->
    Dur = persistent_term:get(cw_bench_durability, null),
    Result = Result0#{store => store_name()},
    R = case is_map_key(error, Result) of
        true -> Result;
        false -> Result#{durability => Dur}
    end,
    io:format(standard_io, ?RESULT_TAG "~0p~n", [R]).

%% ---- the app on a fresh store ----------------------------------------------

start_app(Params) ->
    Dir = tmp_dir(Params),
    start_app_in(Dir, maps:get(app_env, Params, [])),
    Dir.

start_app_in(Dir, AppEnv) ->
    case application:load(couch_workers) of
        ok -> ok;
        {error, {already_loaded, couch_workers}} -> ok
    end,
    %% Notice level reaches our handler (the store's `store_opened' event
    %% is a notice); the default handler prints warnings and worse only.
    ok = logger:set_primary_config(level, notice),
    _ = logger:set_handler_config(default, level, warning),
    _ = logger:add_handler(cw_bench_durability, ?MODULE, #{level => notice}),
    ok = application:set_env(couch_workers, store, store(Dir)),
    [ok = application:set_env(couch_workers, K, V) || {K, V} <- AppEnv],
    {ok, _} = application:ensure_all_started(couch_workers),
    ok.

%% The store of a workload's fresh temporary directory `Dir': the
%% embedded store in it, or (bench/run --store fdb) a FoundationDB
%% directory of its own, couch_workers_test/<basename of Dir>, which the
%% app removes when it stops on node A. Every node of the workload (the
%% peers of start_peer/1 too) opens the same one.
store(Dir) ->
    case persistent_term:get(cw_bench_store, embedded) of
        embedded -> {embedded, Dir};
        {fdb, ClusterFile} -> {fdb_test, ClusterFile, filename:basename(Dir)}
    end.

store_name() ->
    case persistent_term:get(cw_bench_store, embedded) of
        embedded -> embedded;
        {fdb, _} -> fdb
    end.

stop_app(Dir) ->
    _ = application:stop(couch_workers),
    _ = file:del_dir_r(Dir),
    ok.

tmp_dir(Params) ->
    Base = maps:get(tmp, Params, "/tmp"),
    Dir = filename:join(
        Base,
        "cw_bench_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive]))
    ),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    Dir.

%% logger handler: the Rust side logs `store_opened' with the store's own
%% durability string (`Database::durability()' of the core) when the node
%% starts; keep it for the result lines.
-spec log(logger:log_event(), logger:handler_config()) -> ok.
log(#{msg := {report, #{what := store_opened} = R}}, _Config) ->
    persistent_term:put(cw_bench_durability, maps:get(durability, R, null)),
    ok;
log(_Event, _Config) ->
    ok.

%% ---- workloads -------------------------------------------------------------

-spec run(atom(), map()) -> [map()].
run(Workload, Params) ->
    case Workload of
        'J1' -> with_app(Params, fun cw_bench_wl_jobs:j1/1);
        'J1b' -> with_app(Params, fun cw_bench_wl_jobs:j1b/1);
        'J2' -> with_app(Params, fun(P) -> cw_bench_wl_jobs:j2(P, 'J2') end);
        'J2n' -> with_app(Params, fun(P) -> cw_bench_wl_jobs:j2(P#{finish_accept => true}, 'J2n') end);
        'J2t0' -> with_app(Params, fun(P) -> cw_bench_wl_jobs:j2(P#{accept_timeout_ms => 0}, 'J2t0') end);
        'J2l8' -> with_app(Params, fun(P) -> cw_bench_wl_jobs:j2(P#{max_running => 8}, 'J2l8') end);
        'J2f' -> with_app(Params, fun cw_bench_wl_jobs:j2f/1);
        'J3' -> with_app(Params, fun cw_bench_wl_jobs:j3/1);
        'J5' -> with_app(Params, fun cw_bench_wl_jobs:j5/1);
        'J4' -> cw_bench_wl_jobs:j4(Params);
        'M1' -> cw_bench_wl_members:m1(Params);
        'M2' -> cw_bench_wl_members:m2(Params);
        'M2r' -> cw_bench_wl_members:m2(Params#{leave => true});
        'M3' -> cw_bench_wl_members:m3(Params);
        'M4' -> cw_bench_wl_members:m4(Params);
        'I1' -> with_app(Params, fun cw_bench_wl_idle:i1/1);
        'I2' -> with_app(Params, fun cw_bench_wl_idle:i2/1);
        'J3x' -> cw_bench_scale:j3x(Params);
        'J2x' -> cw_bench_wl_nodes:j2x(Params)
    end.

with_app(Params, Fun) ->
    Dir = start_app(Params),
    try
        [Fun(Params)]
    after
        stop_app(Dir)
    end.

%% ---- peers -----------------------------------------------------------------

%% Node B: a second `erl' OS process with this VM's code path, started by
%% OTP's `peer' over standard I/O (no distribution), running couch_workers
%% on the same store (store/1 of `Dir'). Returns the peer and B's OS pid.
start_peer(Dir) ->
    Erl = os:find_executable("erl"),
    OtpLib = code:lib_dir(),
    Paths = [Pa || Pa <- code:get_path(), not lists:prefix(OtpLib, Pa), Pa =/= "."],
    Args = lists:append([["-pa", Pa] || Pa <- Paths]),
    {ok, Peer, _} = peer:start(#{exec => Erl, connection => standard_io, args => Args, wait_boot => 30000}),
    ok = peer:call(Peer, cw_bench_peer, start, [store(Dir)], ?PEER_TIMEOUT),
    OsPid = peer:call(Peer, os, getpid, [], ?PEER_TIMEOUT),
    {Peer, OsPid}.

stop_peer(Peer) ->
    case is_process_alive(Peer) of
        true -> catch peer:stop(Peer);
        false -> ok
    end,
    ok.

%% ---- helpers ---------------------------------------------------------------

now_us() -> erlang:monotonic_time(microsecond).

rate(N, Us) when Us > 0 -> N * 1.0e6 / Us;
rate(_, _) -> 0.0.

%% Nearest-rank percentile of a sorted list.
pct([], _) -> 0;
pct(Sorted, P) ->
    N = length(Sorted),
    Rank = max(1, min(N, ceil(P * N / 100))),
    lists:nth(Rank, Sorted).

%% The result of a workload measured at several sizes (J4, M4): its
%% `Fields', its `Rows' (one per size, smallest first) and, for each
%% `{Key, Figure}' of `Ratios', the figure's value at the largest size over
%% its value at the smallest (how far it grew with the size).
by_size(Fields, Rows, Ratios) ->
    [Small | _] = Rows,
    Large = lists:last(Rows),
    Ratio = fun(Figure) -> maps:get(Figure, Large) / max(1.0e-9, maps:get(Figure, Small)) end,
    maps:merge(Fields#{rows => Rows}, maps:from_list([{Key, Ratio(Figure)} || {Key, Figure} <- Ratios])).

job_id(I) -> <<"job-", (integer_to_binary(I))/binary>>.
worker_id(I) -> <<"w-", (integer_to_binary(I))/binary>>.

%% A field of a job map, whether its keys are atoms or binaries.
field(Key, Job) when is_map(Job) ->
    case maps:find(Key, Job) of
        {ok, V} -> V;
        error -> maps:get(atom_to_binary(Key, utf8), Job)
    end.
