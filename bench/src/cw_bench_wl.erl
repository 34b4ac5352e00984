%% @doc The benchmark's workloads. Each runs in a fresh `erl' VM (started
%% by `cw_bench', the controller) on a fresh temporary store directory,
%% through the public Erlang API of couch_workers only, and prints its
%% result as one line `CWBENCH <Erlang term>' on standard output, which
%% the controller turns into JSON.
%%
%% Clocks: latencies within one VM use erlang:monotonic_time/1. Latencies
%% across two VMs on one host (M2) use os:system_time(microsecond), the
%% OS wall clock (CLOCK_REALTIME), read by both VMs; erlang:system_time/1
%% is not used across VMs because each VM applies its own time offset.
-module(cw_bench_wl).

-export([child/1, run/2]).
%% logger handler (captures the store's durability string)
-export([log/2]).
%% spawned
-export([j2_worker/5, j2f_worker/4, j5_worker/4]).
%% shared with cw_bench_scale (issue 16's workloads)
-export([start_app/1, stop_app/1, start_peer/1, stop_peer/1, pct/2]).

-define(RESULT_TAG, "CWBENCH ").
-define(PEER_TIMEOUT, 30000).

%% ---- entry point in the child VM ------------------------------------------

%% `erl -run cw_bench_wl child Workload ParamsTerm'
-spec child([string()]) -> no_return().
child([Workload, ParamsStr]) ->
    Params = parse_term(ParamsStr),
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

emit(Result) ->
    Dur = persistent_term:get(cw_bench_durability, null),
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
    logger:set_primary_config(level, notice),
    _ = logger:set_handler_config(default, level, warning),
    _ = logger:add_handler(cw_bench_durability, ?MODULE, #{level => notice}),
    ok = application:set_env(couch_workers, store, {embedded, Dir}),
    [ok = application:set_env(couch_workers, K, V) || {K, V} <- AppEnv],
    {ok, _} = application:ensure_all_started(couch_workers),
    ok.

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
        'J1' -> with_app(Params, fun j1/1);
        'J1b' -> with_app(Params, fun j1b/1);
        'J2' -> with_app(Params, fun(P) -> j2(P, 'J2') end);
        'J2n' -> with_app(Params, fun(P) -> j2(P#{finish_accept => true}, 'J2n') end);
        'J2t0' -> with_app(Params, fun(P) -> j2(P#{accept_timeout_ms => 0}, 'J2t0') end);
        'J2f' -> with_app(Params, fun j2f/1);
        'J3' -> with_app(Params, fun j3/1);
        'J5' -> with_app(Params, fun j5/1);
        'J4' -> j4(Params);
        'M1' -> m1(Params);
        'M2' -> m2(Params);
        'M2r' -> m2(Params#{leave => true});
        'M3' -> m3(Params);
        'M4' -> m4(Params);
        'I1' -> with_app(Params, fun i1/1);
        'J3x' -> cw_bench_scale:j3x(Params)
    end.

with_app(Params, Fun) ->
    Dir = start_app(Params),
    try
        [Fun(Params)]
    after
        stop_app(Dir)
    end.

%% J1: N jobs added one at a time, each awaited, by one process.
j1(P) ->
    N = maps:get(jobs, P, 20000),
    Type = <<"j1">>,
    T0 = now_us(),
    ok = j1_loop(Type, 1, N),
    Us = now_us() - T0,
    N = couch_workers:job_pending_count(Type),
    #{workload => 'J1', jobs => N, seconds => Us / 1.0e6, jobs_per_s => rate(N, Us)}.

j1_loop(_Type, I, N) when I > N -> ok;
j1_loop(Type, I, N) ->
    ok = couch_workers:job_add(Type, job_id(I), #{<<"n">> => I}, #{}),
    j1_loop(Type, I + 1, N).

%% J1b: the same N jobs, in batches (default 100) through job_add_many/2.
j1b(P) ->
    N = maps:get(jobs, P, 20000),
    B = maps:get(batch, P, 100),
    Type = <<"j1b">>,
    T0 = now_us(),
    ok = add_batches(Type, 1, N, B),
    Us = now_us() - T0,
    N = couch_workers:job_pending_count(Type),
    #{workload => 'J1b', jobs => N, batch => B, seconds => Us / 1.0e6, jobs_per_s => rate(N, Us)}.

add_batches(_Type, I, N, _B) when I > N -> ok;
add_batches(Type, I, N, B) ->
    Last = min(N, I + B - 1),
    Jobs = [{job_id(J), #{<<"n">> => J}, #{}} || J <- lists:seq(I, Last)],
    ok = couch_workers:job_add_many(Type, Jobs),
    add_batches(Type, Last + 1, N, B).

%% J2: N pending jobs; W registered workers (each its own process) take
%% (job_accept) and finish (job_finish) them all, no-op body. Timed from
%% the start signal to the last job_finish returning. With a positive
%% accept timeout (default 1000 ms) waiting accepts go through the push
%% path (the dispatcher); `J2t0' uses timeout 0 (one transaction per
%% accept, no waiting). `J2n' finishes each job with job_finish_accept/3,
%% which takes the worker's next job in the same transaction (a
%% job_accept only when that took none).
j2(P, Name) ->
    N = maps:get(jobs, P, 20000),
    W = maps:get(workers, P, 8),
    AT = maps:get(accept_timeout_ms, P, 1000),
    Type = <<"j2">>,
    ok = add_batches(Type, 1, N, 1000),
    N = couch_workers:job_pending_count(Type),
    Self = self(),
    Next = maps:get(finish_accept, P, false),
    Pids = [spawn_link(?MODULE, j2_worker, [Self, Type, I, {AT, Next}, go]) || I <- lists:seq(1, W)],
    [receive {ready, Pid} -> ok after 10000 -> error(worker_register_timeout) end || Pid <- Pids],
    T0 = now_us(),
    [Pid ! go || Pid <- Pids],
    Done = [receive {done, Pid, Count, Last} -> {Count, Last} after 120000 -> error(j2_timeout) end || Pid <- Pids],
    Total = lists:sum([C || {C, _} <- Done]),
    TEnd = lists:max([L || {_, L} <- Done]),
    Us = TEnd - T0,
    Left = couch_workers:job_pending_count(Type),
    #{
        workload => Name,
        jobs => Total,
        workers => W,
        accept_timeout_ms => AT,
        pending_left => Left,
        seconds => Us / 1.0e6,
        jobs_per_s => rate(Total, Us)
    }.

j2_worker(Parent, Type, I, How, go) ->
    Ref = couch_workers:worker_register(Type, <<"w", (integer_to_binary(I))/binary>>, #{}, self()),
    true = is_reference(Ref),
    Parent ! {ready, self()},
    receive go -> ok end,
    {Count, Last} = j2_loop(Ref, How, 0, now_us()),
    Parent ! {done, self(), Count, Last}.

j2_loop(Ref, {AT, _} = How, Count, Last) ->
    case couch_workers:job_accept(Ref, #{timeout => AT}) of
        {ok, Job} -> j2_run(Ref, How, Job, Count, Last);
        {error, not_found} -> {Count, Last}
    end.

j2_run(Ref, {_, false} = How, Job, Count, _Last) ->
    ok = couch_workers:job_finish(Job, #{}),
    j2_loop(Ref, How, Count + 1, now_us());
j2_run(Ref, {_, true} = How, Job, Count, _Last) ->
    case couch_workers:job_finish_accept(Job, #{}, Ref) of
        {ok, none} -> j2_loop(Ref, How, Count + 1, now_us());
        {ok, Next} -> j2_run(Ref, How, Next, Count + 1, now_us())
    end.

%% J2f: J2 where a tenth of the jobs fail their first run
%% (`job_fail/3' with `delay => 0': pending again at once) and are
%% retried, by any worker. Timed as J2, until every job is finished.
j2f(P) ->
    N = maps:get(jobs, P, 20000),
    W = maps:get(workers, P, 8),
    Type = <<"j2f">>,
    ok = add_batches(Type, 1, N, 1000),
    Self = self(),
    Pids = [spawn_link(?MODULE, j2f_worker, [Self, Type, I, go]) || I <- lists:seq(1, W)],
    [receive {ready, Pid} -> ok after 10000 -> error(worker_register_timeout) end || Pid <- Pids],
    T0 = now_us(),
    [Pid ! go || Pid <- Pids],
    Done = [receive {done, Pid, C, F, Last} -> {C, F, Last} after 120000 -> error(j2f_timeout) end || Pid <- Pids],
    Finished = lists:sum([C || {C, _, _} <- Done]),
    Failed = lists:sum([F || {_, F, _} <- Done]),
    Us = lists:max([L || {_, _, L} <- Done]) - T0,
    #{finished := Fin} = couch_workers:job_counts(Type),
    #{
        workload => 'J2f',
        jobs => Finished,
        workers => W,
        failed_runs => Failed,
        finished_in_store => Fin,
        seconds => Us / 1.0e6,
        jobs_per_s => rate(Finished, Us),
        runs_per_s => rate(Finished + Failed, Us)
    }.

j2f_worker(Parent, Type, I, go) ->
    Ref = couch_workers:worker_register(Type, <<"w", (integer_to_binary(I))/binary>>, #{}, self()),
    true = is_reference(Ref),
    Parent ! {ready, self()},
    receive go -> ok end,
    {C, F, Last} = j2f_loop(Ref, 0, 0, now_us()),
    Parent ! {done, self(), C, F, Last}.

j2f_loop(Ref, C, F, Last) ->
    case couch_workers:job_accept(Ref, #{timeout => 1000}) of
        {ok, #{info := #{<<"n">> := Nth}, attempts := 1} = Job} when Nth rem 10 =:= 0 ->
            ok = couch_workers:job_fail(Job, #{<<"reason">> => <<"bench">>}, #{delay => 0}),
            j2f_loop(Ref, C, F + 1, now_us());
        {ok, Job} ->
            ok = couch_workers:job_finish(Job, #{}),
            j2f_loop(Ref, C + 1, F, now_us());
        {error, not_found} ->
            {C, F, Last}
    end.

%% J5: N jobs scheduled at random times over `spread_ms' (starting 1 s
%% after they are added), W workers waiting in job_accept. Lateness of
%% each job: the wall clock when job_accept returns it less its run_at
%% (kept in its info), in microseconds. A negative lateness is a job
%% taken early (counted, must be 0).
j5(P) ->
    N = maps:get(jobs, P, 10000),
    Spread = maps:get(spread_ms, P, 10000),
    W = maps:get(workers, P, 8),
    Type = <<"j5">>,
    Start = os:system_time(millisecond) + 1000,
    rand:seed(exsss, {5, 5, 5}),
    Ats = [Start + rand:uniform(Spread) - 1 || _ <- lists:seq(1, N)],
    j5_add(Type, lists:enumerate(Ats)),
    #{scheduled := N} = couch_workers:job_counts(Type),
    Self = self(),
    Pids = [spawn_link(?MODULE, j5_worker, [Self, Type, I, go]) || I <- lists:seq(1, W)],
    [receive {ready, Pid} -> ok after 10000 -> error(worker_register_timeout) end || Pid <- Pids],
    [Pid ! go || Pid <- Pids],
    Late = lists:append([receive {done, Pid, L} -> L after 120000 + Spread -> error(j5_timeout) end || Pid <- Pids]),
    S = lists:sort(Late),
    #{
        workload => 'J5',
        jobs => length(S),
        workers => W,
        spread_ms => Spread,
        early => length([X || X <- S, X < 0]),
        p50_ms => pct(S, 50) / 1000,
        p99_ms => pct(S, 99) / 1000,
        max_ms => lists:last(S) / 1000,
        over_5ms => length([X || X <- S, X > 5000])
    }.

j5_add(_Type, []) ->
    ok;
j5_add(Type, Ats) ->
    {Batch, Rest} = lists:split(min(500, length(Ats)), Ats),
    ok = couch_workers:job_add_many(Type, [{job_id(I), #{<<"at">> => At}, #{run_at => At}} || {I, At} <- Batch]),
    j5_add(Type, Rest).

j5_worker(Parent, Type, I, go) ->
    Ref = couch_workers:worker_register(Type, <<"w", (integer_to_binary(I))/binary>>, #{}, self()),
    true = is_reference(Ref),
    Parent ! {ready, self()},
    receive go -> ok end,
    Parent ! {done, self(), j5_loop(Ref, [])}.

%% Waits up to 3 s for each next job: the jobs are spread over the whole
%% run, so a gap that long means none is left.
j5_loop(Ref, Acc) ->
    case couch_workers:job_accept(Ref, #{timeout => 3000}) of
        {ok, #{info := #{<<"at">> := At}} = Job} ->
            Late = os:system_time(microsecond) - At * 1000,
            ok = couch_workers:job_finish(Job, #{}),
            j5_loop(Ref, [Late | Acc]);
        {error, not_found} ->
            Acc
    end.

%% J3: one idle worker blocked in job_accept (timeout 5 s); a job added
%% every 10 ms (default), 500 jobs. Latency of each job: from just before
%% job_add is called (producer) to job_accept returning it in the worker,
%% both on erlang:monotonic_time in the same VM. The worker finishes each
%% job before accepting again.
j3(P) ->
    N = maps:get(jobs, P, 500),
    Interval = maps:get(interval_ms, P, 10),
    Type = <<"j3">>,
    Self = self(),
    Tab = ets:new(j3, [public, set, {write_concurrency, true}]),
    Worker = spawn_link(fun() ->
        Ref = couch_workers:worker_register(Type, <<"w1">>, #{}, self()),
        true = is_reference(Ref),
        Self ! {ready, self()},
        j3_worker(Ref, Tab, N, [], Self)
    end),
    receive {ready, Worker} -> ok after 10000 -> error(worker_register_timeout) end,
    %% Let the worker's first accept reach the dispatcher.
    timer:sleep(200),
    Start = erlang:monotonic_time(millisecond),
    AddUs = j3_produce(Type, Tab, 1, N, Start, Interval, []),
    Lat = receive {j3_done, L} -> L after 60000 -> error(j3_timeout) end,
    ets:delete(Tab),
    S = lists:sort(Lat),
    A = lists:sort(AddUs),
    #{
        workload => 'J3',
        jobs => length(S),
        interval_ms => Interval,
        p50_ms => pct(S, 50) / 1000,
        p99_ms => pct(S, 99) / 1000,
        max_ms => lists:last(S) / 1000,
        min_ms => hd(S) / 1000,
        over_1ms => length([X || X <- S, X > 1000]),
        %% How long job_add itself took (its commit), for reading the tail.
        add_p50_ms => pct(A, 50) / 1000,
        add_p99_ms => pct(A, 99) / 1000,
        add_max_ms => lists:last(A) / 1000
    }.

j3_produce(_Type, _Tab, I, N, _Start, _Interval, Acc) when I > N -> Acc;
j3_produce(Type, Tab, I, N, Start, Interval, Acc) ->
    Due = Start + (I - 1) * Interval,
    Wait = Due - erlang:monotonic_time(millisecond),
    Wait > 0 andalso timer:sleep(Wait),
    Id = job_id(I),
    T0 = now_us(),
    ets:insert(Tab, {Id, T0}),
    ok = couch_workers:job_add(Type, Id, #{}, #{}),
    j3_produce(Type, Tab, I + 1, N, Start, Interval, [now_us() - T0 | Acc]).

j3_worker(_Ref, _Tab, 0, Acc, Parent) ->
    Parent ! {j3_done, Acc};
j3_worker(Ref, Tab, Left, Acc, Parent) ->
    case couch_workers:job_accept(Ref, #{timeout => 5000}) of
        {ok, Job} ->
            T1 = now_us(),
            Id = field(id, Job),
            [{Id, T0}] = ets:lookup(Tab, Id),
            ok = couch_workers:job_finish(Job, #{}),
            j3_worker(Ref, Tab, Left - 1, [T1 - T0 | Acc], Parent);
        {error, not_found} ->
            j3_worker(Ref, Tab, Left, Acc, Parent)
    end.

%% J4: accept latency with a small and a large number of pending jobs
%% (defaults 1,000 and 1,000,000; the queue is filled with job_add_many,
%% 10,000 jobs a call). At each size, 200 accepts with timeout 0 (one
%% transaction) and 200 with a timeout (through the dispatcher), each
%% followed by an untimed job_finish; the latency is the job_accept call.
j4(P) ->
    Sizes = maps:get(sizes, P, [1000, 1000000]),
    K = maps:get(samples, P, 200),
    Rows = [j4_size(P, Size, K) || Size <- Sizes],
    [Small | _] = Rows,
    Large = lists:last(Rows),
    Ratio = fun(Key) -> maps:get(Key, Large) / max(1.0e-9, maps:get(Key, Small)) end,
    [
        #{
            workload => 'J4',
            sizes => Sizes,
            samples => K,
            rows => Rows,
            t0_p50_ratio => Ratio(t0_p50_ms),
            t0_p99_ratio => Ratio(t0_p99_ms),
            push_p50_ratio => Ratio(push_p50_ms),
            push_p99_ratio => Ratio(push_p99_ms)
        }
    ].

j4_size(P, Size, K) ->
    Dir = start_app(P),
    try
        Type = <<"j4">>,
        F0 = now_us(),
        ok = add_batches(Type, 1, Size, 10000),
        FillUs = now_us() - F0,
        Size = couch_workers:job_pending_count(Type),
        Ref = couch_workers:worker_register(Type, <<"w1">>, #{}, self()),
        true = is_reference(Ref),
        %% Warm-up (statement caches, first dispatcher).
        _ = j4_samples(Ref, 0, 20),
        _ = j4_samples(Ref, 1000, 20),
        T0s = lists:sort(j4_samples(Ref, 0, K)),
        Push = lists:sort(j4_samples(Ref, 1000, K)),
        #{
            pending => Size,
            fill_seconds => FillUs / 1.0e6,
            fill_jobs_per_s => rate(Size, FillUs),
            t0_p50_ms => pct(T0s, 50) / 1000,
            t0_p99_ms => pct(T0s, 99) / 1000,
            push_p50_ms => pct(Push, 50) / 1000,
            push_p99_ms => pct(Push, 99) / 1000
        }
    after
        stop_app(Dir)
    end.

j4_samples(_Ref, _AT, 0) ->
    [];
j4_samples(Ref, AT, K) ->
    T0 = now_us(),
    {ok, Job} = couch_workers:job_accept(Ref, #{timeout => AT}),
    T1 = now_us(),
    ok = couch_workers:job_finish(Job, #{}),
    [T1 - T0 | j4_samples(Ref, AT, K - 1)].

%% M1: N workers of one type, each its own process, timeout 5 s,
%% registered one after another (each awaited); then, on a fresh store,
%% the same N registering all at once (concurrent).
m1(P) ->
    N = maps:get(workers, P, 1000),
    Opts = #{timeout => 5},
    Dir1 = start_app(P),
    SeqUs =
        try
            T0 = now_us(),
            Owners1 = [register_owner(<<"m1">>, worker_id(I), Opts) || I <- lists:seq(1, N)],
            Us0 = now_us() - T0,
            [exit(O, kill) || O <- Owners1],
            Us0
        after
            stop_app(Dir1)
        end,
    Dir2 = start_app(P),
    ConcUs =
        try
            T1 = now_us(),
            Owners2 = register_concurrently(<<"m1c">>, N, Opts),
            Us = now_us() - T1,
            [exit(O, kill) || O <- Owners2],
            Us
        after
            stop_app(Dir2)
        end,
    [
        #{
            workload => 'M1',
            workers => N,
            timeout_s => 5,
            seconds => SeqUs / 1.0e6,
            regs_per_s => rate(N, SeqUs),
            concurrent_seconds => ConcUs / 1.0e6,
            concurrent_regs_per_s => rate(N, ConcUs)
        }
    ].

%% A new process that registers `Id' and lives on (its owner); returns
%% once the registration returned.
register_owner(Type, Id, Opts) ->
    Self = self(),
    Pid = spawn(fun() ->
        Ref = couch_workers:worker_register(Type, Id, Opts, self()),
        Self ! {registered, self(), Ref},
        receive stop -> ok end
    end),
    receive
        {registered, Pid, Ref} when is_reference(Ref) -> Pid;
        {registered, Pid, Other} -> error({register_failed, Other})
    after 30000 -> error(register_timeout)
    end.

register_concurrently(Type, N, Opts) ->
    Self = self(),
    Pids = [
        spawn(fun() ->
            Ref = couch_workers:worker_register(Type, worker_id(I), Opts, self()),
            Self ! {registered, self(), Ref},
            receive stop -> ok end
        end)
     || I <- lists:seq(1, N)
    ],
    [
        receive
            {registered, Pid, Ref} when is_reference(Ref) -> Pid;
            {registered, Pid, Other} -> error({register_failed, Other})
        after 60000 -> error(register_timeout)
        end
     || Pid <- Pids
    ].

%% M2: a subscriber on node A (this VM); 200 joins one after another on
%% node B (a peer VM on the same store). For each: from worker_register
%% returning on B to the delivery that first contains the worker on A, on
%% the host's wall clock (see the module doc). `M2r' (leave => true): the
%% same, but each worker leaves again (untimed) once A has seen it, so the
%% membership never exceeds one worker.
m2(P) ->
    N = maps:get(joins, P, 200),
    Leave = maps:get(leave, P, false),
    Dir = start_app(P),
    {Peer, _OsPid} = start_peer(Dir),
    try
        Type = <<"m2">>,
        Collector = start_collector(Type, fun() -> os:system_time(microsecond) end),
        Lat = [m2_join(Peer, Collector, Type, worker_id(I), Leave) || I <- lists:seq(1, N)],
        S = lists:sort(Lat),
        [
            #{
                workload => case Leave of true -> 'M2r'; false -> 'M2' end,
                joins => N,
                members_at_most => case Leave of true -> 1; false -> N end,
                clock => <<"os:system_time(microsecond) (CLOCK_REALTIME) on both nodes">>,
                p50_ms => pct(S, 50) / 1000,
                p99_ms => pct(S, 99) / 1000,
                max_ms => lists:last(S) / 1000,
                min_ms => hd(S) / 1000
            }
        ]
    after
        stop_peer(Peer),
        stop_app(Dir)
    end.

m2_join(Peer, Collector, Type, Id, Leave) ->
    {ok, TReturned} = peer:call(Peer, cw_bench_peer, register_timed, [Type, Id, #{}], ?PEER_TIMEOUT),
    TSeen = await_seen(Collector, Id, 10000),
    case Leave of
        true ->
            ok = peer:call(Peer, cw_bench_peer, leave, [Id], ?PEER_TIMEOUT),
            _ = await_gone(Collector, Id, 10000);
        false ->
            ok
    end,
    TSeen - TReturned.

%% M3: a worker with timeout 3 s on node B; B's OS process is killed with
%% kill -9; from just before the kill to the delivery on A without the
%% worker (A's monotonic clock). Repeated with a fresh B each time.
m3(P) ->
    R = maps:get(repeats, P, 5),
    TimeoutS = maps:get(timeout_s, P, 3),
    Dir = start_app(P),
    try
        Type = <<"m3">>,
        Collector = start_collector(Type, fun now_us/0),
        Samples = [m3_once(Dir, Collector, Type, worker_id(I), TimeoutS) || I <- lists:seq(1, R)],
        [
            #{
                workload => 'M3',
                repeats => R,
                timeout_s => TimeoutS,
                samples_ms => [S / 1000 || S <- Samples],
                mean_ms => lists:sum(Samples) / R / 1000,
                max_ms => lists:max(Samples) / 1000
            }
        ]
    after
        stop_app(Dir)
    end.

m3_once(Dir, Collector, Type, Id, TimeoutS) ->
    {Peer, OsPid} = start_peer(Dir),
    ok = peer:call(Peer, cw_bench_peer, register_owned, [Type, Id, #{timeout => TimeoutS}], ?PEER_TIMEOUT),
    _ = await_seen(Collector, Id, 10000),
    %% A random phase against B's heartbeats (renewed every third of the
    %% timeout): kill between 1 and 2 heartbeat periods after the join.
    Period = TimeoutS * 1000 div 3,
    timer:sleep(Period + rand:uniform(Period)),
    T0 = now_us(),
    _ = os:cmd("kill -9 " ++ OsPid),
    TGone = await_gone(Collector, Id, (TimeoutS + 10) * 1000),
    stop_peer(Peer),
    TGone - T0.

%% M4: the cost of one membership change with a large and a small
%% membership (defaults 10,000 and 100 workers, timeout 3600 s so that no
%% heartbeat falls inside the measurement). A subscriber on the same node;
%% 20 joins one after another; each timed from just before
%% worker_register to the delivery that contains the new worker
%% (monotonic clock). The node's CPU time per change (utime + stime of the
%% VM's OS process, every thread: BEAM and the Rust runtime) is measured
%% over the joins, less the idle CPU rate measured over 2 s before them
%% (the reaper's periodic scans).
m4(P) ->
    Sizes = maps:get(sizes, P, [100, 10000]),
    K = maps:get(changes, P, 20),
    Rows = [m4_size(P, Size, K) || Size <- Sizes],
    [Small | _] = Rows,
    Large = lists:last(Rows),
    Ratio = fun(Key) -> maps:get(Key, Large) / max(1.0e-9, maps:get(Key, Small)) end,
    [
        #{
            workload => 'M4',
            sizes => Sizes,
            changes => K,
            rows => Rows,
            p50_ratio => Ratio(p50_ms),
            cpu_per_change_ratio => Ratio(cpu_ms_per_change),
            size_ratio => lists:last(Sizes) / hd(Sizes)
        }
    ].

m4_size(P, Size, K) ->
    Dir = start_app(P),
    try
        Type = <<"m4">>,
        Opts = #{timeout => 3600},
        R0 = now_us(),
        Owners = lists:append([
            register_concurrently_ids(Type, [worker_id(I) || I <- lists:seq(B, min(Size, B + 499))], Opts)
         || B <- lists:seq(1, Size, 500)
        ]),
        RegUs = now_us() - R0,
        Collector = start_collector(Type, fun now_us/0),
        ok = await_size(Collector, Size, 60000),
        %% Idle CPU rate (reaper scans, watcher polls) over 2 s.
        I0 = {now_us(), cpu_ms()},
        timer:sleep(2000),
        I1 = {now_us(), cpu_ms()},
        IdleRate = (element(2, I1) - element(2, I0)) / (element(1, I1) - element(1, I0)),
        C0 = {now_us(), cpu_ms()},
        {Lat, Extra} = lists:unzip([m4_join(Collector, Type, I) || I <- lists:seq(1, K)]),
        C1 = {now_us(), cpu_ms()},
        Elapsed = element(1, C1) - element(1, C0),
        CpuRaw = element(2, C1) - element(2, C0),
        Cpu = max(0.0, CpuRaw - IdleRate * Elapsed),
        Entries = collector_last_size(Collector),
        [exit(O, kill) || O <- Owners ++ Extra],
        S = lists:sort(Lat),
        #{
            members => Size,
            register_seconds => RegUs / 1.0e6,
            p50_ms => pct(S, 50) / 1000,
            p99_ms => pct(S, 99) / 1000,
            max_ms => lists:last(S) / 1000,
            cpu_ms_per_change => Cpu / K,
            cpu_ms_per_change_raw => CpuRaw / K,
            idle_cpu_ms_per_s => IdleRate * 1.0e6,
            delivered_entries => Entries
        }
    after
        stop_app(Dir)
    end.

m4_join(Collector, Type, I) ->
    Id = <<"extra_", (integer_to_binary(I))/binary>>,
    T0 = now_us(),
    Owner = register_owner(Type, Id, #{timeout => 3600}),
    TSeen = await_seen(Collector, Id, 30000),
    {TSeen - T0, Owner}.

register_concurrently_ids(Type, Ids, Opts) ->
    Self = self(),
    Pids = [
        spawn(fun() ->
            Ref = couch_workers:worker_register(Type, Id, Opts, self()),
            Self ! {registered, self(), Ref},
            receive stop -> ok end
        end)
     || Id <- Ids
    ],
    [
        receive
            {registered, Pid, Ref} when is_reference(Ref) -> Pid;
            {registered, Pid, Other} -> error({register_failed, Other})
        after 60000 -> error(register_timeout)
        end
     || Pid <- Pids
    ].

%% I1: an idle node. One registered worker, one membership subscription
%% and one job_accept waiting (timeout longer than the span), nothing
%% else happening: the whole VM's CPU over `seconds' (after 2 s to settle:
%% the registration's own writes and their watches). The heartbeat (timeout
%% 15 s: every ~5 s) is part of what an idle node does.
i1(P) ->
    Secs = maps:get(seconds, P, 60),
    Type = <<"i1">>,
    Owner = spawn(fun() -> receive stop -> ok end end),
    Ref = couch_workers:worker_register(Type, <<"idle-1">>, #{}, Owner),
    true = is_reference(Ref),
    Sub = couch_workers:membership_subscribe(Type, nil, Owner),
    true = is_reference(Sub),
    Acceptor = spawn(fun() -> couch_workers:job_accept(Ref, #{timeout => (Secs + 10) * 1000}) end),
    timer:sleep(2000),
    C0 = cpu_ms(),
    T0 = now_us(),
    timer:sleep(Secs * 1000),
    Cpu = cpu_ms() - C0,
    Span = (now_us() - T0) / 1.0e6,
    exit(Acceptor, kill),
    ok = couch_workers:membership_unsubscribe(Sub),
    ok = couch_workers:worker_unregister(Ref),
    Owner ! stop,
    #{
        workload => 'I1',
        seconds => Span,
        cpu_ms => Cpu,
        cpu_ms_per_10s => Cpu / Span * 10,
        pct_of_one_core => Cpu / (Span * 1000) * 100,
        what => <<"one worker, one membership subscription, one waiting job_accept; whole VM">>
    }.

%% CPU time of this OS process, ms: the sum over its live threads (BEAM
%% schedulers, the Rust runtime, the store's watcher thread) of the first
%% field of /proc/self/task/*/schedstat (ns on the CPU). Falls back to
%% utime + stime of /proc/self/stat (10 ms ticks) without schedstat.
cpu_ms() ->
    case file:list_dir("/proc/self/task") of
        {ok, Tids} ->
            Ns = lists:sum([task_ns(T) || T <- Tids]),
            case Ns of
                0 -> stat_cpu_ms();
                _ -> Ns / 1.0e6
            end;
        _ ->
            stat_cpu_ms()
    end.

task_ns(Tid) ->
    case file:read_file("/proc/self/task/" ++ Tid ++ "/schedstat") of
        {ok, Bin} ->
            [Ns | _] = binary:split(Bin, <<" ">>),
            binary_to_integer(Ns);
        _ ->
            0
    end.

stat_cpu_ms() ->
    {ok, Bin} = file:read_file("/proc/self/stat"),
    [_, Rest] = binary:split(Bin, <<") ">>),
    Fields = binary:split(Rest, <<" ">>, [global]),
    (binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields))) * 10.0.

%% ---- membership collector --------------------------------------------------

%% A process subscribed (Module = nil) to `Type' that stamps every delivery
%% with `Clock()' as it arrives and keeps, per worker id, the time of the
%% first delivery that had it and of the first that no longer had it.
start_collector(Type, Clock) ->
    Self = self(),
    Pid = spawn_link(fun() ->
        Ref = couch_workers:membership_subscribe(Type, nil, self()),
        Self ! {collector, self(), Ref},
        collector_loop(Clock, #{}, #{}, #{}, 0, [])
    end),
    receive {collector, Pid, Ref} when is_reference(Ref) -> Pid
    after 10000 -> error(subscribe_timeout)
    end.

collector_loop(Clock, Prev, Seen, Gone, LastSize, Waiting) ->
    receive
        {couch_workers_membership, _Type, Workers, _VS, _Ref} ->
            T = Clock(),
            Joined = [Id || Id <- maps:keys(Workers), not is_map_key(Id, Prev)],
            Left = [Id || Id <- maps:keys(Prev), not is_map_key(Id, Workers)],
            Seen1 = lists:foldl(fun(Id, A) -> A#{Id => T} end, Seen, Joined),
            Gone1 = lists:foldl(fun(Id, A) -> A#{Id => T} end, Gone, Left),
            Waiting1 = answer_waiters(Waiting, Seen1, Gone1, map_size(Workers)),
            collector_loop(Clock, Workers, Seen1, Gone1, map_size(Workers), Waiting1);
        {wait, _Kind, _Arg, _From} = W ->
            Waiting1 = answer_waiters([W | Waiting], Seen, Gone, LastSize),
            collector_loop(Clock, Prev, Seen, Gone, LastSize, Waiting1);
        {last_size, From} ->
            From ! {last_size, self(), LastSize},
            collector_loop(Clock, Prev, Seen, Gone, LastSize, Waiting)
    end.

answer_waiters(Waiting, Seen, Gone, Size) ->
    lists:filter(
        fun
            ({wait, seen, Id, From}) when is_map_key(Id, Seen) ->
                From ! {seen, Id, maps:get(Id, Seen)},
                false;
            ({wait, gone, Id, From}) when is_map_key(Id, Gone) ->
                From ! {gone, Id, maps:get(Id, Gone)},
                false;
            ({wait, size, N, From}) when Size >= N ->
                From ! {size, N},
                false;
            (_) ->
                true
        end,
        Waiting
    ).

await_seen(Collector, Id, Timeout) ->
    Collector ! {wait, seen, Id, self()},
    receive {seen, Id, T} -> T
    after Timeout -> error({not_seen, Id})
    end.

await_gone(Collector, Id, Timeout) ->
    Collector ! {wait, gone, Id, self()},
    receive {gone, Id, T} -> T
    after Timeout -> error({not_gone, Id})
    end.

await_size(Collector, N, Timeout) ->
    Collector ! {wait, size, N, self()},
    receive {size, N} -> ok
    after Timeout -> error({size_not_reached, N})
    end.

collector_last_size(Collector) ->
    Collector ! {last_size, self()},
    receive {last_size, Collector, N} -> N
    after 5000 -> error(collector_timeout)
    end.

%% ---- peers -----------------------------------------------------------------

%% Node B: a second `erl' OS process with this VM's code path, started by
%% OTP's `peer' over standard I/O (no distribution), running couch_workers
%% on the same store directory. Returns the peer and B's OS pid.
start_peer(Dir) ->
    Erl = os:find_executable("erl"),
    OtpLib = code:lib_dir(),
    Paths = [Pa || Pa <- code:get_path(), not lists:prefix(OtpLib, Pa), Pa =/= "."],
    Args = lists:append([["-pa", Pa] || Pa <- Paths]),
    {ok, Peer, _} = peer:start(#{exec => Erl, connection => standard_io, args => Args, wait_boot => 30000}),
    ok = peer:call(Peer, cw_bench_peer, start, [Dir], ?PEER_TIMEOUT),
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

job_id(I) -> <<"job-", (integer_to_binary(I))/binary>>.
worker_id(I) -> <<"w-", (integer_to_binary(I))/binary>>.

%% A field of a job map, whether its keys are atoms or binaries.
field(Key, Job) when is_map(Job) ->
    case maps:find(Key, Job) of
        {ok, V} -> V;
        error -> maps:get(atom_to_binary(Key, utf8), Job)
    end.
