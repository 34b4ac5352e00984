%% @doc The idle node's workloads of the benchmark (I1, and I2 with 100
%% schedules), and the CPU time of the VM's OS process that they and M4
%% measure.
-module(cw_bench_wl_idle).

-export([i1/1, i2/1, cpu_ms/0, thread_cpu_ms/0, thread_switches/0]).

-import(cw_bench_wl, [now_us/0]).

-spec i1(map()) -> map().
-spec i2(map()) -> map().
-spec cpu_ms() -> float().
-spec thread_cpu_ms() -> #{binary() => float()}.
-spec thread_switches() -> #{binary() => non_neg_integer()}.
-spec probe_cost() -> {float(), integer()}.

%% I1: an idle node. One registered worker, one membership subscription
%% and one job_accept waiting (timeout longer than the span), nothing
%% else happening: the whole VM's CPU over `seconds' (after 2 s to settle:
%% the registration's own writes and their watches). The heartbeat (timeout
%% 15 s: every ~5 s) is part of what an idle node does. The figures:
%% window/1.
i1(P) ->
    Secs = maps:get(seconds, P, 60),
    Type = <<"i1">>,
    Owner = spawn(fun() -> receive stop -> ok end end),
    Ref = couch_workers:worker_register(Type, <<"idle-1">>, #{}, Owner),
    true = is_reference(Ref),
    Sub = couch_workers:membership_subscribe(Type, nil, Owner),
    true = is_reference(Sub),
    Acceptor = spawn(fun() -> couch_workers:job_accept(Ref, #{timeout => (Secs + 10) * 1000}) end),
    Window = window(Secs),
    exit(Acceptor, kill),
    ok = couch_workers:membership_unsubscribe(Sub),
    ok = couch_workers:worker_unregister(Ref),
    Owner ! stop,
    Window#{
        workload => 'I1',
        what => <<"one worker, one membership subscription, one waiting job_accept; whole VM">>
    }.

%% I2: an idle node with 100 schedules of one job type (half every hour,
%% half a daily cron slot), no worker: the schedule runner sleeps until
%% the earliest slot, so over the window it runs no transaction (but by
%% chance at an hour's turn, then a few) and its CPU is the idle node's.
%% The same figures as I1. (It was a test of the core crate, a node with
%% 100 schedules under 8 ms of CPU in 8 s: a timed assertion, which fails
%% on a loaded machine whatever the code does, so it is a figure here.)
i2(P) ->
    Secs = maps:get(seconds, P, 60),
    Type = <<"i2">>,
    Ids = [<<"s", (integer_to_binary(I))/binary>> || I <- lists:seq(0, 99)],
    [
        ok = couch_workers:schedule_set(Type, Id, spec(I), #{}, #{})
     || {I, Id} <- lists:enumerate(0, Ids)
    ],
    Window = window(Secs),
    [ok = couch_workers:schedule_remove(Type, Id) || Id <- Ids],
    Window#{
        workload => 'I2',
        schedules => length(Ids),
        what => <<"100 schedules (hourly and daily), no worker; whole VM">>
    }.

spec(I) when I rem 2 =:= 0 -> #{every => 3600000};
spec(_) -> #{cron => <<"17 3 * * *">>}.

%% The idle window of I1 and I2: after 2 s to settle (the set-up's own
%% writes and their watches), the whole VM's CPU over `Secs', the store
%% transactions the node ran in it (the retry loop's count: a figure the
%% machine's load does not change), the CPU per thread name (which of the
%% node's threads spent it) and the context switches per thread name (how
%% often each woke: on an idle VM a wake-up costs far more than the little
%% it does, and load does not move the count the way it moves the CPU).
window(Secs) ->
    timer:sleep(2000),
    Th0 = thread_cpu_ms(),
    Tx0 = transactions(),
    {ProbeMs, ProbeSw} = probe_cost(),
    C0 = cpu_ms(),
    Sw0 = thread_switches(),
    T0 = now_us(),
    timer:sleep(Secs * 1000),
    Sw1 = thread_switches(),
    Cpu = cpu_ms() - C0,
    Span = (now_us() - T0) / 1.0e6,
    Tx = transactions() - Tx0,
    Th1 = thread_cpu_ms(),
    Switches = maps:filter(
        fun(_, N) -> N > 0 end,
        maps:map(fun(Name, N) -> N - maps:get(Name, Sw0, 0) end, Sw1)
    ),
    Threads = maps:filter(
        fun(_, Ms) -> Ms > 0.0 end,
        maps:map(fun(Name, Ms) -> round((Ms - maps:get(Name, Th0, 0.0)) * 100) / 100 end, Th1)
    ),
    #{
        seconds => Span,
        cpu_ms => Cpu,
        cpu_ms_per_10s => Cpu / Span * 10,
        pct_of_one_core => Cpu / (Span * 1000) * 100,
        transactions => Tx,
        transactions_per_s => Tx / Span,
        thread_cpu_ms => Threads,
        thread_switches => Switches,
        switches => lists:sum(maps:values(Switches)),
        probe_cpu_ms => ProbeMs,
        probe_switches => ProbeSw,
        pct_of_one_core_less_probe => max(0.0, Cpu - ProbeMs) / (Span * 1000) * 100
    }.

%% What reading the counters costs the VM: the window's own reads (a CPU
%% read, a switch snapshot; then a switch snapshot, a CPU read) run back to
%% back with no sleep between, just before the window. Each /proc file
%% read goes through a dirty I/O scheduler (several thread switches), so
%% on an idle VM this is not small beside what the node itself does.
probe_cost() ->
    C0 = cpu_ms(),
    Sw0 = thread_switches(),
    Sw1 = thread_switches(),
    C1 = cpu_ms(),
    {C1 - C0, lists:sum(maps:values(Sw1)) - lists:sum(maps:values(Sw0))}.

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
    per_thread_name(fun(T) ->
        Name = case file:read_file("/proc/self/task/" ++ T ++ "/comm") of
            {ok, N} -> string:trim(N);
            _ -> <<"?">>
        end,
        {ok, Name, task_ns(T) / 1.0e6}
    end).

%% Context switches (voluntary + involuntary) per thread name so far: each
%% voluntary one is a sleep and so a wake-up after it. Threads of one name
%% summed; a thread that exited since the first read is not counted.
thread_switches() ->
    per_thread_name(fun(T) ->
        case file:read_file("/proc/self/task/" ++ T ++ "/status") of
            {ok, Status} ->
                {Name, N} = switches_of(Status),
                {ok, Name, N};
            _ ->
                skip
        end
    end).

%% Sums Read(Tid)'s figure over this VM's threads, by thread name.
per_thread_name(Read) ->
    case file:list_dir("/proc/self/task") of
        {ok, Tids} ->
            lists:foldl(
                fun(T, Acc) ->
                    case Read(T) of
                        {ok, Name, V} -> maps:update_with(Name, fun(M) -> M + V end, V, Acc);
                        skip -> Acc
                    end
                end,
                #{},
                Tids
            );
        _ ->
            #{}
    end.

switches_of(Status) ->
    Lines = binary:split(Status, <<"\n">>, [global]),
    lists:foldl(
        fun(Line, {Name, N} = Acc) ->
            case binary:split(Line, <<":">>) of
                [<<"Name">>, V] -> {string:trim(V), N};
                [<<"voluntary_ctxt_switches">>, V] -> {Name, N + binary_to_integer(string:trim(V))};
                [<<"nonvoluntary_ctxt_switches">>, V] -> {Name, N + binary_to_integer(string:trim(V))};
                _ -> Acc
            end
        end,
        {<<"?">>, 0},
        Lines
    ).

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
