%% @doc The job queue's workloads of the benchmark (J1, J1b, J2, J2n, J2t0,
%% J2f, J3, J4, J5), run by `cw_bench_wl' in the child VM.
-module(cw_bench_wl_jobs).

-export([j1/1, j1b/1, j2/2, j2f/1, j3/1, j4/1, j5/1]).
%% spawned
-export([j2_worker/5, j2f_worker/4, j5_worker/4]).

-import(cw_bench_wl, [start_app/1, stop_app/1, now_us/0, rate/2, pct/2, job_id/1, field/2, by_size/3]).

-spec j1(map()) -> map().
-spec j1b(map()) -> map().
-spec j2(map(), atom()) -> map().
-spec j2f(map()) -> map().
-spec j3(map()) -> map().
-spec j4(map()) -> [map()].
-spec j5(map()) -> map().
-spec j2_worker(pid(), binary(), pos_integer(), {non_neg_integer(), boolean()}, go) -> tuple().
-spec j2f_worker(pid(), binary(), pos_integer(), go) -> tuple().
-spec j5_worker(pid(), binary(), pos_integer(), go) -> tuple().

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
%% job_accept only when that took none). `J2l8' sets the type's
%% `max_running' to 8 (as many as the workers: what the limit's reads
%% and conflicts cost, not a wait for slots).
j2(P, Name) ->
    N = maps:get(jobs, P, 20000),
    W = maps:get(workers, P, 8),
    AT = maps:get(accept_timeout_ms, P, 1000),
    Type = <<"j2">>,
    MaxRunning = maps:get(max_running, P, infinity),
    %% Only J2l8 sets the type's limit: J2 and the others run a type with
    %% no settings stored, as they did before the settings existed.
    MaxRunning =:= infinity orelse (ok = couch_workers:job_type_set(Type, #{max_running => MaxRunning})),
    ok = add_batches(Type, 1, N, 1000),
    N = couch_workers:job_pending_count(Type),
    Self = self(),
    Next = maps:get(finish_accept, P, false),
    Pids = [spawn_link(?MODULE, j2_worker, [Self, Type, I, {AT, Next}, go]) || I <- lists:seq(1, W)],
    [receive {ready, Pid} -> ok after 10000 -> error(worker_register_timeout) end || Pid <- Pids],
    St0 = couch_workers_nif:ops_store_counters(),
    Th0 = cw_bench_wl_idle:thread_cpu_ms(),
    Sw0 = cw_bench_wl_idle:thread_switches(),
    C0 = cw_bench_wl_idle:cpu_ms(),
    T0 = now_us(),
    [Pid ! go || Pid <- Pids],
    Done = [
        receive
            {done, Pid, Count, Last} -> {Count, Last};
            {failed, _, Why} -> j2_failed(Why, St0, T0)
        after 120000 -> error(j2_timeout)
        end
     || Pid <- Pids
    ],
    %% The VM's CPU over the drain (the fill left out): CPU per job is a
    %% count that the machine's load changes less than the rate.
    Cpu = cw_bench_wl_idle:cpu_ms() - C0,
    Sw1 = cw_bench_wl_idle:thread_switches(),
    Th1 = cw_bench_wl_idle:thread_cpu_ms(),
    St1 = couch_workers_nif:ops_store_counters(),
    Total = lists:sum([C || {C, _} <- Done]),
    TEnd = lists:max([L || {_, L} <- Done]),
    Us = TEnd - T0,
    Left = couch_workers:job_pending_count(Type),
    #{
        workload => Name,
        jobs => Total,
        workers => W,
        accept_timeout_ms => AT,
        max_running => MaxRunning,
        pending_left => Left,
        seconds => Us / 1.0e6,
        jobs_per_s => rate(Total, Us),
        cpu_us_per_job => round(Cpu * 1000 / max(Total, 1)),
        %% Which threads spent the CPU and how often each slept and woke,
        %% per job: counts to compare builds by on a loaded machine, where
        %% the rate and the CPU itself move with the load.
        thread_cpu_us_per_job => per_job(fun(Ms) -> Ms * 1000 end, Th0, Th1, Total),
        thread_switches_per_job => per_job(fun(Switches) -> Switches end, Sw0, Sw1, Total),
        %% Store transactions (the retry loop's runs: the node's services'
        %% beside the jobs') and their conflicts, per job.
        store_per_job => per_job(fun(Count) -> Count end, St0, St1, Total)
    }.

%% A worker's call answered an error (the store gave up): the workload
%% fails with that answer, how long into the drain, and what the store's
%% retry loop did meanwhile (conflicts, retries, failures).
-spec j2_failed(term(), map(), integer()) -> no_return().
j2_failed(Why, St0, T0) ->
    St1 = couch_workers_nif:ops_store_counters(),
    error({worker_call_failed, Why, #{
        after_ms => (now_us() - T0) div 1000,
        store => maps:map(fun(K, V) -> V - maps:get(K, St0, 0) end, St1)
    }}).

%% Per thread name: what grew from Before to After, scaled by Scale and
%% divided by the jobs (two decimals); names that did not grow left out.
per_job(Scale, Before, After, Jobs) ->
    maps:filter(
        fun(_, V) -> V > 0 end,
        maps:map(
            fun(Name, V) -> round(Scale(V - maps:get(Name, Before, 0)) * 100 / max(Jobs, 1)) / 100 end,
            After
        )
    ).

j2_worker(Parent, Type, I, How, go) ->
    Ref = couch_workers:worker_register(Type, <<"w", (integer_to_binary(I))/binary>>, #{}, self()),
    true = is_reference(Ref),
    Parent ! {ready, self()},
    receive go -> ok end,
    try j2_loop(Ref, How, 0, now_us()) of
        {Count, Last} -> Parent ! {done, self(), Count, Last}
    catch
        throw:{call_failed, Why} -> Parent ! {failed, self(), Why}
    end.

j2_loop(Ref, {AT, _} = How, Count, Last) ->
    case couch_workers:job_accept(Ref, #{timeout => AT}) of
        {ok, Job} -> j2_run(Ref, How, Job, Count, Last);
        {error, not_found} -> {Count, Last};
        Other -> throw({call_failed, {job_accept, Other}})
    end.

j2_run(Ref, {_, false} = How, Job, Count, _Last) ->
    case couch_workers:job_finish(Job, #{}) of
        ok -> j2_loop(Ref, How, Count + 1, now_us());
        Other -> throw({call_failed, {job_finish, Other}})
    end;
j2_run(Ref, {_, true} = How, Job, Count, _Last) ->
    case couch_workers:job_finish_accept(Job, #{}, Ref) of
        {ok, none} -> j2_loop(Ref, How, Count + 1, now_us());
        {ok, Next} -> j2_run(Ref, How, Next, Count + 1, now_us());
        Other -> throw({call_failed, {job_finish_accept, Other}})
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
    _ = rand:seed(exsss, {5, 5, 5}),
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
    [
        by_size(#{workload => 'J4', sizes => Sizes, samples => K}, Rows, [
            {t0_p50_ratio, t0_p50_ms},
            {t0_p99_ratio, t0_p99_ms},
            {push_p50_ratio, push_p50_ms},
            {push_p99_ratio, push_p99_ms}
        ])
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
