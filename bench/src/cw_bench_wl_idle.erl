%% @doc The idle node's workload of the benchmark (I1), and the CPU time of
%% the VM's OS process that it and M4 measure.
-module(cw_bench_wl_idle).

-export([i1/1, cpu_ms/0, thread_cpu_ms/0]).

-import(cw_bench_wl, [now_us/0]).

-spec i1(map()) -> map().
-spec cpu_ms() -> float().
-spec thread_cpu_ms() -> #{binary() => float()}.

%% I1: an idle node. One registered worker, one membership subscription
%% and one job_accept waiting (timeout longer than the span), nothing
%% else happening: the whole VM's CPU over `seconds' (after 2 s to settle:
%% the registration's own writes and their watches). The heartbeat (timeout
%% 15 s: every ~5 s) is part of what an idle node does. Beside the CPU it
%% reports the store transactions the node ran in the window (the retry
%% loop's count: a figure the machine's load does not change) and the CPU
%% per thread name (which of the node's threads spent it).
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
    Th0 = thread_cpu_ms(),
    Tx0 = transactions(),
    C0 = cpu_ms(),
    T0 = now_us(),
    timer:sleep(Secs * 1000),
    Cpu = cpu_ms() - C0,
    Span = (now_us() - T0) / 1.0e6,
    Tx = transactions() - Tx0,
    Th1 = thread_cpu_ms(),
    Threads = maps:filter(
        fun(_, Ms) -> Ms > 0.0 end,
        maps:map(fun(Name, Ms) -> round((Ms - maps:get(Name, Th0, 0.0)) * 100) / 100 end, Th1)
    ),
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
        transactions => Tx,
        transactions_per_s => Tx / Span,
        thread_cpu_ms => Threads,
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

%% CPU time per thread name, ms (threads of one name summed: the BEAM's
%% schedulers, the runtime's workers).
thread_cpu_ms() ->
    case file:list_dir("/proc/self/task") of
        {ok, Tids} ->
            lists:foldl(
                fun(T, Acc) ->
                    Name = case file:read_file("/proc/self/task/" ++ T ++ "/comm") of
                        {ok, N} -> string:trim(N);
                        _ -> <<"?">>
                    end,
                    maps:update_with(Name, fun(Ms) -> Ms + task_ns(T) / 1.0e6 end, task_ns(T) / 1.0e6, Acc)
                end,
                #{},
                Tids
            );
        _ ->
            #{}
    end.

%% The node's store transactions so far (attempts, reads included).
transactions() ->
    maps:get(transactions, couch_workers_nif:ops_store_counters()).

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
