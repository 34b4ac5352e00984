%% @doc The idle node's workload of the benchmark (I1), and the CPU time of
%% the VM's OS process that it and M4 measure.
-module(cw_bench_wl_idle).

-export([i1/1, cpu_ms/0]).

-import(cw_bench_wl, [now_us/0]).

-spec i1(map()) -> map().
-spec cpu_ms() -> float().

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
