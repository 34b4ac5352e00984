%% @doc J2x: J2 across 1, 2 and 4 nodes, all accepting from one queue.
%% Run by `cw_bench_wl' in the child VM (node A); nodes B, C, D are
%% further `erl' OS processes (cw_bench_wl:start_peer/1) on the same store
%% (the same FoundationDB cluster and directory, or the same embedded
%% directory). For each node count K, on a fresh store: node A adds N
%% pending jobs, each of the K nodes registers W workers (own processes,
%% job_accept with a 1 s timeout + job_finish, no-op body, as J2), all
%% start together and drain the queue (a worker whose accept answers
%% not_found while jobs are still pending counts it and accepts again). Reported per K: jobs/s (from the
%% start signal to the last job_finish on any node, on the host's wall
%% clock) and, summed over the nodes, the store's transactions, conflicts
%% and retries during the drain (each node's `couch_workers:metrics/0'
%% `store' counters, read before the start and after its last worker
%% ended) per accepted job.
-module(cw_bench_wl_nodes).

-export([j2x/1]).
%% run on every node (node A directly, the others through peer:call/5)
-export([prepare/4, go/0, await/1]).
%% spawned
-export([coordinator/5, worker/5]).

-spec j2x(map()) -> [map()].
-spec prepare(binary(), pos_integer(), pos_integer(), non_neg_integer()) -> ok.
-spec go() -> ok.
-spec await(timeout()) -> {ok, map()} | {error, term()}.
-spec coordinator(pid(), binary(), pos_integer(), pos_integer(), non_neg_integer()) -> ok.
-spec worker(pid(), binary(), binary(), non_neg_integer(), go) -> tuple().

-import(cw_bench_wl, [start_app/1, stop_app/1, start_peer/1, stop_peer/1, rate/2, job_id/1]).

-define(PEER_TIMEOUT, 30000).
-define(NAME, cw_bench_j2x).
-define(ACCEPT_TIMEOUT_MS, 1000).

j2x(P) ->
    Nodes = maps:get(nodes, P, [1, 2, 4]),
    Rows = [j2x_nodes(P, K) || K <- Nodes],
    [One | _] = Rows,
    Last = lists:last(Rows),
    [
        #{
            workload => 'J2x',
            nodes => Nodes,
            jobs => maps:get(jobs, P, 20000),
            workers_per_node => maps:get(workers, P, 4),
            accept_timeout_ms => ?ACCEPT_TIMEOUT_MS,
            rows => Rows,
            %% How the rate moved from 1 node to the most nodes (>= 1: it
            %% did not fall as nodes were added).
            jobs_per_s_ratio => maps:get(jobs_per_s, Last) / max(1.0e-9, maps:get(jobs_per_s, One)),
            conflicts_per_job_at_max => maps:get(conflicts_per_job, Last)
        }
    ].

j2x_nodes(P, K) ->
    N = maps:get(jobs, P, 20000),
    W = maps:get(workers, P, 4),
    Dir = start_app(P),
    Peers = [start_peer(Dir) || _ <- lists:seq(2, K)],
    try
        Type = <<"j2x">>,
        ok = add_batches(Type, 1, N, 1000),
        N = couch_workers:job_pending_count(Type),
        %% Every node's workers registered and waiting for the signal.
        ok = prepare(Type, W, 1, ?ACCEPT_TIMEOUT_MS),
        [ok = peer:call(Peer, ?MODULE, prepare, [Type, W, I, ?ACCEPT_TIMEOUT_MS], ?PEER_TIMEOUT) || {I, {Peer, _}} <- lists:enumerate(2, Peers)],
        T0 = os:system_time(microsecond),
        ok = go(),
        [ok = peer:call(Peer, ?MODULE, go, [], ?PEER_TIMEOUT) || {Peer, _} <- Peers],
        Results = [await(300000) | [peer:call(Peer, ?MODULE, await, [300000], 310000) || {Peer, _} <- Peers]],
        Per = [case R of {ok, M} -> M; {error, Why} -> error({j2x_node_failed, Why}) end || R <- Results],
        Left = couch_workers:job_pending_count(Type),
        Jobs = lists:sum([maps:get(jobs, M) || M <- Per]),
        Us = lists:max([maps:get(last_us, M) || M <- Per]) - T0,
        Sum = fun(Key) -> lists:sum([maps:get(Key, maps:get(store, M)) || M <- Per]) end,
        PerJob = fun(X) -> round(X * 1000 / max(Jobs, 1)) / 1000 end,
        #{
            nodes => K,
            workers => K * W,
            jobs => Jobs,
            pending_left => Left,
            seconds => Us / 1.0e6,
            jobs_per_s => rate(Jobs, Us),
            jobs_per_node => [maps:get(jobs, M) || M <- Per],
            accepted_counter => lists:sum([maps:get(accepted, M) || M <- Per]),
            transactions => Sum(transactions),
            conflicts => Sum(conflicts),
            retries => Sum(retries),
            failures => Sum(failures),
            transactions_per_job => PerJob(Sum(transactions)),
            conflicts_per_job => PerJob(Sum(conflicts)),
            retries_per_job => PerJob(Sum(retries)),
            conflicts_per_job_by_node => [PerJob(maps:get(conflicts, maps:get(store, M))) || M <- Per],
            %% Accepts (timeout 1 s) that answered not_found while jobs
            %% were pending, per node: the waiter was not served in time.
            not_found_while_pending_by_node => [maps:get(not_found_while_pending, M) || M <- Per]
        }
    after
        [stop_peer(Peer) || {Peer, _} <- Peers],
        stop_app(Dir)
    end.

add_batches(_Type, I, N, _B) when I > N -> ok;
add_batches(Type, I, N, B) ->
    Last = min(N, I + B - 1),
    ok = couch_workers:job_add_many(Type, [{job_id(J), #{<<"n">> => J}, #{}} || J <- lists:seq(I, Last)]),
    add_batches(Type, Last + 1, N, B).

%% ---- on every node -----------------------------------------------------------

%% W workers of `Type' registered on this node (ids n<Node>w<I>), each
%% waiting for go/0; returns once all are registered. The coordinator is
%% registered as ?NAME (nothing but plain terms crosses to the peers).
prepare(Type, W, Node, AT) ->
    Self = self(),
    Pid = spawn(?MODULE, coordinator, [Self, Type, W, Node, AT]),
    receive
        {prepared, Pid} -> ok
    after 30000 -> error(j2x_prepare_timeout)
    end.

go() ->
    ?NAME ! go,
    ok.

await(Timeout) ->
    Ref = make_ref(),
    ?NAME ! {await, self(), Ref},
    receive
        {Ref, Result} -> {ok, Result}
    after Timeout -> {error, timeout}
    end.

coordinator(Parent, Type, W, Node, AT) ->
    true = register(?NAME, self()),
    Self = self(),
    Prefix = <<"n", (integer_to_binary(Node))/binary, "w">>,
    Pids = [spawn_link(?MODULE, worker, [Self, Type, <<Prefix/binary, (integer_to_binary(I))/binary>>, AT, go]) || I <- lists:seq(1, W)],
    [receive {ready, Pid} -> ok after 10000 -> error(worker_register_timeout) end || Pid <- Pids],
    Parent ! {prepared, self()},
    receive go -> ok end,
    S0 = store_counters(),
    A0 = accepted(Type),
    [Pid ! go || Pid <- Pids],
    Done = [receive {done, Pid, Count, Last, Early} -> {Count, Last, Early} end || Pid <- Pids],
    S1 = store_counters(),
    A1 = accepted(Type),
    Result = #{
        jobs => lists:sum([C || {C, _, _} <- Done]),
        last_us => lists:max([L || {_, L, _} <- Done]),
        not_found_while_pending => lists:sum([E || {_, _, E} <- Done]),
        accepted => A1 - A0,
        store => maps:map(fun(Key, V) -> V - maps:get(Key, S0, 0) end, S1)
    },
    %% The name goes when this process ends, after the answer.
    receive {await, From, Ref} -> From ! {Ref, Result} end,
    ok.

%% The store's counters of this node (the retry loop's, process-wide: one
%% OS process is one node).
store_counters() ->
    maps:get(store, couch_workers:metrics()).

accepted(Type) ->
    case couch_workers:metrics() of
        #{types := #{Type := #{jobs_accepted := N}}} -> N;
        _ -> 0
    end.

worker(Parent, Type, Id, AT, go) ->
    Ref = couch_workers:worker_register(Type, Id, #{}, self()),
    true = is_reference(Ref),
    Parent ! {ready, self()},
    receive go -> ok end,
    {Count, Last, Early} = loop(Type, Ref, AT, 0, os:system_time(microsecond), 0),
    Parent ! {done, self(), Count, Last, Early}.

%% Until the queue is empty: a `not_found' while jobs are still pending
%% (the node's accept round did not serve the waiter within its timeout)
%% is counted, and the worker accepts again.
loop(Type, Ref, AT, Count, Last, Early) ->
    case couch_workers:job_accept(Ref, #{timeout => AT}) of
        {ok, Job} ->
            ok = couch_workers:job_finish(Job, #{}),
            loop(Type, Ref, AT, Count + 1, os:system_time(microsecond), Early);
        {error, not_found} ->
            case couch_workers:job_pending_count(Type) of
                0 -> {Count, Last, Early};
                _ -> loop(Type, Ref, AT, Count, Last, Early + 1)
            end
    end.
