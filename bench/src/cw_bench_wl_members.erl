%% @doc The membership's workloads of the benchmark (M1, M2, M2r, M3, M4),
%% run by `cw_bench_wl' in the child VM, and the collector process that
%% stamps membership deliveries.
-module(cw_bench_wl_members).

-export([m1/1, m2/1, m3/1, m4/1]).

-import(cw_bench_wl, [start_app/1, stop_app/1, now_us/0, rate/2, pct/2, worker_id/1, start_peer/1, stop_peer/1, by_size/3]).

%% A call into node B (as `cw_bench_wl:start_peer/1' makes it).
-define(PEER_TIMEOUT, 30000).
-import(cw_bench_wl_idle, [cpu_ms/0]).

-spec m1(map()) -> [map()].
-spec m2(map()) -> [map()].
-spec m3(map()) -> [map()].
-spec m4(map()) -> [map()].

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
    register_concurrently_ids(Type, [worker_id(I) || I <- lists:seq(1, N)], Opts).

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
        Collector = start_collector(Type, fun cw_bench_wl:now_us/0),
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
    Fields = #{workload => 'M4', sizes => Sizes, changes => K, size_ratio => lists:last(Sizes) / hd(Sizes)},
    [by_size(Fields, Rows, [{p50_ratio, p50_ms}, {cpu_per_change_ratio, cpu_ms_per_change}])].

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
        Collector = start_collector(Type, fun cw_bench_wl:now_us/0),
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
