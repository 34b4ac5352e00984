%% @doc The cross-node workload, run in a benchmark child VM (see
%% cw_bench_wl): J3x, a job added on node B (a second `erl' OS process on
%% the same store directory) while a worker waits in job_accept on node A.
%% Also the B side of it (called through peer:call/5).
-module(cw_bench_scale).

-export([j3x/1]).
%% called on node B
-export([add_timed/2]).

-define(PEER_TIMEOUT, 30000).

%% J3x: 1 idle worker in job_accept on A, a job_add on B every
%% `interval_ms', `jobs' jobs: from just before job_add on B to job_accept
%% returning on A, both read on os:system_time(microsecond) (one clock for
%% every process of the host).
-spec j3x(map()) -> [map()].
j3x(P) ->
    N = maps:get(jobs, P, 500),
    Interval = maps:get(interval_ms, P, 10),
    Type = <<"j3x">>,
    Dir = cw_bench_wl:start_app(P),
    {Peer, _OsPid} = cw_bench_wl:start_peer(Dir),
    Self = self(),
    try
        Worker = spawn_link(fun() ->
            Ref = couch_workers:worker_register(Type, <<"w1">>, #{}, self()),
            true = is_reference(Ref),
            Self ! {ready, self()},
            worker(Ref, Self)
        end),
        receive {ready, Worker} -> ok after 10000 -> error(worker_register_timeout) end,
        %% Let the worker's first accept reach the dispatcher.
        timer:sleep(200),
        Lat = [one(Peer, Type, I, Interval) || I <- lists:seq(1, N)],
        unlink(Worker),
        exit(Worker, kill),
        S = lists:sort([L || {L, _} <- Lat]),
        A = lists:sort([Add || {_, Add} <- Lat]),
        [
            #{
                workload => 'J3x',
                jobs => length(S),
                interval_ms => Interval,
                clock => <<"os:system_time(microsecond) (CLOCK_REALTIME) on both nodes">>,
                p50_ms => cw_bench_wl:pct(S, 50) / 1000,
                p99_ms => cw_bench_wl:pct(S, 99) / 1000,
                max_ms => lists:last(S) / 1000,
                min_ms => hd(S) / 1000,
                over_1ms => length([X || X <- S, X > 1000]),
                %% job_add's own time on B (its commit), for reading the tail.
                add_p50_ms => cw_bench_wl:pct(A, 50) / 1000,
                add_p99_ms => cw_bench_wl:pct(A, 99) / 1000
            }
        ]
    after
        cw_bench_wl:stop_peer(Peer),
        cw_bench_wl:stop_app(Dir)
    end.

one(Peer, Type, I, Interval) ->
    timer:sleep(Interval),
    Id = <<"job-", (integer_to_binary(I))/binary>>,
    {ok, T0, AddUs} = peer:call(Peer, ?MODULE, add_timed, [Type, Id], ?PEER_TIMEOUT),
    receive
        {accepted, Id, T1} -> {T1 - T0, AddUs}
    after 10000 -> error({not_accepted, Id})
    end.

worker(Ref, Parent) ->
    case couch_workers:job_accept(Ref, #{timeout => 5000}) of
        {ok, #{id := Id} = Job} ->
            T1 = os:system_time(microsecond),
            Parent ! {accepted, Id, T1},
            ok = couch_workers:job_finish(Job, #{}),
            worker(Ref, Parent);
        {error, not_found} ->
            worker(Ref, Parent)
    end.

%% On node B: adds the job; returns the OS wall clock just before the
%% call, and how long the call took (microseconds).
-spec add_timed(binary(), binary()) -> {ok, integer(), integer()}.
add_timed(Type, Id) ->
    T0 = os:system_time(microsecond),
    M0 = erlang:monotonic_time(microsecond),
    ok = couch_workers:job_add(Type, Id, #{}, #{}),
    {ok, T0, erlang:monotonic_time(microsecond) - M0}.
