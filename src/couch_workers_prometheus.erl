%% @doc `couch_workers_metrics:metrics/0' in the Prometheus text
%% exposition format (version 0.0.4), for `couch_workers:metrics(prometheus)'
%% and the status page's `/metrics'.
%%
%% Counters are `couch_workers_<name>_total{node, type}'; latencies are
%% summaries in seconds (`quantile' 0.5 and 0.99, `_sum', `_count') with
%% a `_max' gauge beside each; the store's counters carry only `node'.
%% Given `running' (`couch_workers_status:running_limits/0'), the gauges
%% `couch_workers_jobs_running{type}' and
%% `couch_workers_jobs_max_running{type}' (`+Inf' without a limit): read
%% from the store, the same on every node, so without `node'.
%% Every family has its `# HELP' and `# TYPE', once, before its samples.
%% Label values are escaped as the format says (backslash, double quote,
%% newline); bytes of a type that is not UTF-8 are read back as the text `\xNN' (the
%% format's label values are UTF-8 text).
-module(couch_workers_prometheus).

-export([format/1, content_type/0]).

%% @doc The Content-Type of the format.
-spec content_type() -> string().
content_type() ->
    "text/plain; version=0.0.4; charset=utf-8".

%% @doc The exposition of a `couch_workers_metrics:metrics/0' map.
-spec format(map()) -> iodata().
format(#{node := Node, store := Store, types := Types} = Metrics) ->
    NodeL = label_value(atom_to_binary(Node)),
    Sorted = lists:sort(maps:to_list(Types)),
    Counters = [
        family(
            ["couch_workers_", atom_to_list(C), "_total"],
            counter,
            help(C),
            [{[{"node", NodeL}, {"type", label_value(T)}], maps:get(C, M)} || {T, M} <- Sorted]
        )
     || C <- couch_workers_metrics:counters()
    ],
    Latencies = [latency(H, NodeL, Sorted) || H <- couch_workers_metrics:histograms()],
    StoreFams = [
        family(
            ["couch_workers_store_", atom_to_list(K), "_total"],
            counter,
            store_help(K),
            [{[{"node", NodeL}], maps:get(K, Store, 0)}]
        )
     || K <- [transactions, conflicts, retries, failures]
    ],
    ServiceFams = [
        family(
            ["couch_workers_", atom_to_list(K), "_total"],
            counter,
            store_help(K),
            [{[{"node", NodeL}], maps:get(K, Store, 0)}]
        )
     || K <- [services_restarted, services_failing]
    ],
    [Counters, Latencies, StoreFams, ServiceFams, running(maps:get(running, Metrics, []))].

running([]) ->
    [];
running(Limits) ->
    Sorted = lists:sort(Limits),
    [
        family(
            "couch_workers_jobs_running",
            gauge,
            "Jobs of the type running now, cluster-wide (the store's exact counter).",
            [{[{"type", label_value(T)}], N} || {T, N, _} <- Sorted, is_integer(N)]
        ),
        family(
            "couch_workers_jobs_max_running",
            gauge,
            "The type's max_running (job_type_set/2), cluster-wide; +Inf without a limit.",
            [{[{"type", label_value(T)}], M} || {T, _, M} <- Sorted, M =/= unknown]
        )
    ].

latency(H, NodeL, Sorted) ->
    Name = ["couch_workers_", latency_name(H), "_seconds"],
    Samples = lists:append([
        begin
            #{count := N, sum_us := Sum, p50_us := P50, p99_us := P99} = maps:get(H, maps:get(latency, M)),
            L = [{"node", NodeL}, {"type", label_value(T)}],
            [
                {Name, L ++ [{"quantile", "0.5"}], seconds(P50)},
                {Name, L ++ [{"quantile", "0.99"}], seconds(P99)},
                {[Name, "_sum"], L, seconds(Sum)},
                {[Name, "_count"], L, N}
            ]
        end
     || {T, M} <- Sorted
    ]),
    Max = [
        {[{"node", NodeL}, {"type", label_value(T)}], seconds(maps:get(max_us, maps:get(H, maps:get(latency, M))))}
     || {T, M} <- Sorted
    ],
    [
        header(Name, summary, latency_help(H)),
        [sample(N, L, V) || {N, L, V} <- Samples],
        family([Name, "_max"], gauge, ["Longest ", latency_help(H)], Max)
    ].

family(Name, Type, Help, Samples) ->
    [header(Name, Type, Help), [sample(Name, L, V) || {L, V} <- Samples]].

header(Name, Type, Help) ->
    ["# HELP ", Name, " ", Help, "\n", "# TYPE ", Name, " ", atom_to_list(Type), "\n"].

sample(Name, [], Value) ->
    [Name, " ", value(Value), "\n"];
sample(Name, Labels, Value) ->
    Ls = lists:join(",", [[K, "=\"", V, "\""] || {K, V} <- Labels]),
    [Name, "{", Ls, "} ", value(Value), "\n"].

value(infinity) -> "+Inf";
value(V) when is_integer(V) -> integer_to_list(V);
value(V) when is_float(V) -> float_to_list(V, [short]).

seconds(Us) -> Us / 1.0e6.

%% Escapes a label value; bytes of invalid UTF-8 become `\xNN'.
label_value(Bin) ->
    case unicode:characters_to_list(Bin) of
        Chars when is_list(Chars) -> unicode:characters_to_binary(lists:map(fun escape/1, Chars));
        _ -> iolist_to_binary([escape_byte(B) || <<B>> <= Bin])
    end.

escape($\\) -> "\\\\";
escape($") -> "\\\"";
escape($\n) -> "\\n";
escape(C) -> C.

%% `\\xNN' in the text: the format knows no `\x' escape, so the value
%% read back is the four characters `\xNN'.
escape_byte(B) when B >= 16#80 -> io_lib:format("\\\\x~2.16.0b", [B]);
escape_byte(B) -> escape(B).

latency_name(accept_wait) -> "job_accept_wait";
latency_name(add) -> "job_add";
latency_name(finish) -> "job_finish";
latency_name(fail) -> "job_fail";
latency_name(release) -> "job_release";
latency_name(resubmit) -> "job_resubmit".

latency_help(accept_wait) -> "wait of job_accept calls that got a job, on this node.";
latency_help(add) -> "duration of job_add and job_add_many calls, on this node.";
latency_help(finish) -> "duration of job_finish calls, on this node.";
latency_help(fail) -> "duration of job_fail calls, on this node.";
latency_help(release) -> "duration of job_release calls, on this node.";
latency_help(resubmit) -> "duration of job_resubmit calls, on this node.".

help(jobs_added) -> "Jobs added through this node.";
help(jobs_accepted) -> "Jobs accepted by workers on this node.";
help(jobs_finished) -> "Jobs finished by workers on this node.";
help(jobs_failed) -> "job_fail calls on this node that ended their job failed (retry false, or no attempts left).";
help(jobs_retried) -> "job_fail calls on this node that queued their job again (attempts left).";
help(jobs_released) -> "Jobs given back with job_release by workers on this node.";
help(jobs_resubmitted) -> "job_resubmit calls answered ok on this node (added, requeued or marked to run again).";
help(jobs_requeued) -> "Running jobs of dead workers that this node failed over (its reaper, and its sweeper's leftovers).";
help(jobs_timed_out) -> "Running jobs of this node's workers taken back for their activity timeout.";
help(jobs_pruned) -> "Ended jobs past their keep that this node's pruner removed.";
help(jobs_canceled) -> "job_cancel calls answered ok on this node (a finished job's included).";
help(jobs_removed) -> "Jobs removed through this node.";
help(workers_registered) -> "Workers registered on this node.";
help(workers_unregistered) -> "Workers of this node removed (unregistered, or their owner exited).";
help(workers_reaped) -> "Dead workers (of any node) reaped by this node's reaper.";
help(heartbeat_failures) -> "Heartbeats of this node's workers that failed to commit.".

store_help(transactions) -> "Store transaction attempts of this node (retries included).";
store_help(conflicts) -> "Store transaction attempts of this node that conflicted.";
store_help(retries) -> "Store transaction attempts of this node that were retried.";
store_help(failures) -> "Store transactions of this node that gave up with an error.";
store_help(services_restarted) -> "Background tasks of this node restarted after a panic or an unexpected end.";
store_help(services_failing) -> "Background tasks of this node reported failing (5 restarts within a minute).".
