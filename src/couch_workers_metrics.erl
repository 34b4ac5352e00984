%% @doc This node's counters and latency summaries, since the app started,
%% for `couch_workers:metrics/0,1'.
%%
%% Kept without locks: one `atomics' array per type (job type and worker
%% type are one label, `type': workers of type T take jobs of type T),
%% found through the public ETS table `couch_workers_metrics'
%% (`{Type, Atomics}'). Counting is an ETS lookup and a few atomic adds
%% (about a microsecond), from whichever process did the work; only a
%% type's first event inserts a row (`ets:insert_new/2', so racing first
%% events share one array). This server only owns the table.
%%
%% Latencies (microseconds) go to a histogram of 144 buckets, four per
%% power of two (so a quantile read from it is at most 25 % above the
%% true value; it is reported as its bucket's upper bound, never above
%% the maximum seen), with its count, sum and maximum.
%%
%% Bounded: at most `?MAX_TYPES' types get a row of their own, and types
%% over `?MAX_LABEL' bytes never do; the rest are counted under
%% `<<"_other">>' (Prometheus labels of unbounded cardinality would harm
%% the scraper).
%%
%% The store's counters (transactions, conflicts, retries, failures) are
%% the Rust retry loop's (`couch_workers_nif:ops_store_counters/0').
-module(couch_workers_metrics).

-behaviour(gen_server).

-export([start_link/0, count/2, count/3, observe/3, record/4, metrics/0, counters/0, histograms/0, quantile/2]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(TAB, couch_workers_metrics).
-define(MAX_TYPES, 1000).
-define(MAX_LABEL, 200).
-define(OTHER, <<"_other">>).
%% Histogram buckets: 0..3 us one each, then four per power of two up to
%% 2^36 us (19 hours); longer goes to the last.
-define(BUCKETS, 144).
%% Slots of one histogram: count, sum, max, then the buckets.
-define(HIST_SLOTS, (3 + ?BUCKETS)).

-type counter() ::
    jobs_added
    | jobs_accepted
    | jobs_finished
    | jobs_failed
    | jobs_retried
    | jobs_released
    | jobs_resubmitted
    | jobs_canceled
    | jobs_removed
    | jobs_requeued
    | jobs_timed_out
    | jobs_pruned
    | workers_registered
    | workers_unregistered
    | workers_reaped
    | heartbeat_failures.
-type histogram() :: accept_wait | add | finish | fail | release | resubmit.
-type summary() :: #{count := non_neg_integer(), sum_us := non_neg_integer(), p50_us := non_neg_integer(), p99_us := non_neg_integer(), max_us := non_neg_integer()}.
-export_type([counter/0, histogram/0, summary/0]).

%% @doc The counters, in their slot order (what each counts:
%% couch_workers_observe, docs/api.md).
-spec counters() -> [counter()].
counters() ->
    [
        jobs_added,
        jobs_accepted,
        jobs_finished,
        jobs_failed,
        jobs_retried,
        jobs_released,
        jobs_resubmitted,
        jobs_canceled,
        jobs_removed,
        jobs_requeued,
        jobs_timed_out,
        jobs_pruned,
        workers_registered,
        workers_unregistered,
        workers_reaped,
        heartbeat_failures
    ].

%% @doc The latency histograms: `accept_wait' (how long a `job_accept/2'
%% that got a job waited), `add' (`job_add/4', `job_add_many/2'),
%% `finish' (`job_finish/2'), `fail' (`job_fail/3'), `release'
%% (`job_release/2'), `resubmit' (`job_resubmit/4').
-spec histograms() -> [histogram()].
histograms() ->
    [accept_wait, add, finish, fail, release, resubmit].

%% ---- counting --------------------------------------------------------------

%% @doc Adds one to `Counter' of `Type'.
-spec count(counter(), binary()) -> ok.
count(Counter, Type) ->
    count(Counter, Type, 1).

%% @doc Adds `N' to `Counter' of `Type'. A no-op while the app is not
%% running (no table).
-spec count(counter(), binary(), non_neg_integer()) -> ok.
count(Counter, Type, N) ->
    case array(Type) of
        undefined -> ok;
        A -> atomics:add(A, counter_slot(Counter), N)
    end.

%% @doc Records one latency of `Us' microseconds in `Histogram' of `Type'.
-spec observe(histogram(), binary(), integer()) -> ok.
observe(Histogram, Type, Us) ->
    case array(Type) of
        undefined -> ok;
        A -> observe_in(A, Histogram, Us)
    end.

%% @doc `count(Counter, Type)' and `observe(Histogram, Type, Us)' with
%% one lookup of the type's array (the hot path's common case).
-spec record(counter(), histogram(), binary(), integer()) -> ok.
record(Counter, Histogram, Type, Us) ->
    case array(Type) of
        undefined ->
            ok;
        A ->
            atomics:add(A, counter_slot(Counter), 1),
            observe_in(A, Histogram, Us)
    end.

observe_in(A, Histogram, Us0) ->
    Us = max(0, Us0),
    Base = hist_base(Histogram),
    atomics:add(A, Base, 1),
    atomics:add(A, Base + 1, Us),
    bump_max(A, Base + 2, Us),
    atomics:add(A, Base + 3 + bucket(Us), 1).

%% The array of `Type', made on its first event.
array(Type) ->
    Key = label_key(Type),
    try ets:lookup(?TAB, Key) of
        [{_, A}] -> A;
        [] -> new_array(Key)
    catch
        error:badarg -> undefined
    end.

label_key(Type) when is_binary(Type), byte_size(Type) =< ?MAX_LABEL -> Type;
label_key(_Type) -> ?OTHER.

new_array(Key) ->
    Key1 =
        case ets:info(?TAB, size) < ?MAX_TYPES of
            true -> Key;
            false -> ?OTHER
        end,
    A = atomics:new(length(counters()) + length(histograms()) * ?HIST_SLOTS, [{signed, false}]),
    _ = ets:insert_new(?TAB, {Key1, A}),
    [{_, Stored}] = ets:lookup(?TAB, Key1),
    Stored.

%% No atomic max in `atomics': compare and swap until the stored value is
%% at least `V' (lock-free: a lost race retries against the newer value).
bump_max(A, Ix, V) ->
    Old = atomics:get(A, Ix),
    case V > Old of
        false ->
            ok;
        true ->
            case atomics:compare_exchange(A, Ix, Old, V) of
                ok -> ok;
                _ -> bump_max(A, Ix, V)
            end
    end.

counter_slot(Counter) -> index(Counter, counters(), 1).

hist_base(Histogram) ->
    length(counters()) + (index(Histogram, histograms(), 1) - 1) * ?HIST_SLOTS + 1.

index(X, [X | _], N) -> N;
index(X, [_ | T], N) -> index(X, T, N + 1);
index(X, [], _) -> erlang:error({unknown_metric, X}).

%% Bucket of a latency: 0..3 us their own; then, for 2^E =< Us < 2^(E+1),
%% four buckets split by the two bits after the leading one.
bucket(Us) when Us < 4 ->
    Us;
bucket(Us) ->
    E = log2(Us, 0),
    min(?BUCKETS - 1, 4 * (E - 1) + ((Us bsr (E - 2)) band 3)).

log2(1, E) -> E;
log2(N, E) -> log2(N bsr 1, E + 1).

%% The largest latency a bucket holds.
bucket_top(I) when I < 4 ->
    I;
bucket_top(I) ->
    E = I div 4 + 1,
    ((5 + I rem 4) bsl (E - 2)) - 1.

%% ---- reading -----------------------------------------------------------------

%% @doc Everything: `#{node, store => #{transactions, conflicts, retries,
%% failures, services_restarted, services_failing}, types => #{Type => #{Counter => N, latency => #{Histogram
%% => summary()}}}}'.
-spec metrics() -> map().
metrics() ->
    Rows =
        try
            ets:tab2list(?TAB)
        catch
            error:badarg -> []
        end,
    #{
        node => node(),
        store => store_counters(),
        types => maps:from_list([{Type, type_metrics(A)} || {Type, A} <- Rows])
    }.

store_counters() ->
    try
        couch_workers_nif:ops_store_counters()
    catch
        error:_ ->
            #{
                transactions => 0,
                conflicts => 0,
                retries => 0,
                failures => 0,
                services_restarted => 0,
                services_failing => 0
            }
    end.

type_metrics(A) ->
    Counts = maps:from_list([{C, atomics:get(A, counter_slot(C))} || C <- counters()]),
    Counts#{latency => maps:from_list([{H, summary(A, hist_base(H))} || H <- histograms()])}.

summary(A, Base) ->
    Count = atomics:get(A, Base),
    Max = atomics:get(A, Base + 2),
    Buckets = [atomics:get(A, Base + 3 + I) || I <- lists:seq(0, ?BUCKETS - 1)],
    #{
        count => Count,
        sum_us => atomics:get(A, Base + 1),
        p50_us => min(Max, quantile(0.5, Buckets)),
        p99_us => min(Max, quantile(0.99, Buckets)),
        max_us => Max
    }.

%% @doc The `Q' quantile (0 < Q =< 1) of a histogram's bucket counts, as
%% the upper bound of the bucket it falls in (0 for an empty histogram).
-spec quantile(float(), [non_neg_integer()]) -> non_neg_integer().
quantile(Q, Buckets) ->
    case lists:sum(Buckets) of
        0 -> 0;
        Total -> quantile_walk(Buckets, max(1, ceil(Q * Total)), 0, 0)
    end.

quantile_walk([N | Rest], Rank, Seen, I) ->
    case Seen + N >= Rank of
        true -> bucket_top(I);
        false -> quantile_walk(Rest, Rank, Seen + N, I + 1)
    end;
quantile_walk([], _Rank, _Seen, I) ->
    bucket_top(I - 1).

%% ---- the table's owner ---------------------------------------------------------

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec init([]) -> {ok, #{}}.
init([]) ->
    ?TAB = ets:new(?TAB, [named_table, public, set, {read_concurrency, true}, {write_concurrency, true}]),
    {ok, #{}}.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, term(), map()}.
handle_call(Msg, _From, St) ->
    couch_workers_server:unknown_call(?MODULE, Msg, St).

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(Msg, St) ->
    couch_workers_server:unknown_cast(?MODULE, Msg, St).

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info(Msg, St) ->
    couch_workers_server:unknown_info(?MODULE, Msg, St).

-spec terminate(term(), map()) -> ok.
terminate(_Reason, _St) ->
    ok.
