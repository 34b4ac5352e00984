%% @doc What the status page shows, gathered in one place for its HTML
%% (`couch_workers_status_page') and its JSON (`/api/status'): per worker
%% type the live workers (cluster-wide, from the store), per job type
%% (`job_types/0') its exact counts by state (`job_counts/1'), its latest
%% failures with their errors (`job_list/2' of state `failed'), whether
%% it is paused (`couch_workers_ops:job_paused/1': the public API has no
%% call that reads the flag) and this node's throughput history; each
%% worker type's leader (`leader/1') and each job type's schedules with
%% their next run (`schedules/1'), and its settings (`job_type_get/1':
%% its running limits beside its running count). The job types are those
%% with jobs and those with schedules (`couch_workers_schedules:types/0').
%%
%% A read that fails shows as `unknown' (the page says "n/a") rather than
%% a guess.
-module(couch_workers_status).

-export([collect/1, running_limits/0]).

%% Workers listed per type (the count says how many there are).
-define(MAX_LISTED, 200).
%% Latest failures listed per job type, among the first failed jobs read.
-define(FAILURES, 5).
-define(FAILED_READ, 100).

%% @doc The status; `History' is the throughput history
%% (`couch_workers_http:history/0').
-spec collect(map()) -> map().
collect(History) ->
    WorkerTypes = list_or_empty(couch_workers:worker_types()),
    Metrics = couch_workers:metrics(),
    #{
        node => node(),
        worker_types => [worker_type(T) || T <- WorkerTypes],
        job_types => [job_type(T, History) || T <- job_types()],
        metrics => Metrics
    }.

worker_type(T) ->
    Workers = list_or_empty(couch_workers:workers(T)),
    #{type => T, total => length(Workers), workers => lists:sublist(Workers, ?MAX_LISTED), leader => leader(T)}.

%% The type's leader's id, `null' when it has none, `unknown' when the
%% read failed.
leader(T) ->
    case couch_workers:leader(T) of
        {ok, Id, _Epoch} -> Id;
        {error, not_found} -> null;
        {error, _} -> unknown
    end.

%% The types with jobs and the types with schedules: a type whose first
%% slot is not due yet has a schedule and no job, and is shown too.
job_types() ->
    lists:umerge(
        lists:usort(list_or_empty(couch_workers:job_types())),
        lists:usort(list_or_empty(couch_workers_schedules:types()))
    ).

job_type(T, History) ->
    #{
        type => T,
        counts => counts(T),
        failures => failures(T),
        paused => paused(T),
        throughput => maps:get(T, History, []),
        schedules => schedules(T),
        settings => settings(T)
    }.

%% @doc Per job type, its running jobs (cluster-wide, the exact counter)
%% and its `max_running' (`infinity' when it has none); `unknown' for a
%% read that failed. For `/metrics'.
-spec running_limits() -> [{binary(), non_neg_integer() | unknown, pos_integer() | infinity | unknown}].
running_limits() ->
    [
        {T, maps:get(running, counts(T), unknown), maps:get(max_running, settings(T), unknown)}
     || T <- job_types()
    ].

%% The type's settings (`job_type_get/1'); `#{}' when the read failed.
settings(T) ->
    case couch_workers:job_type_get(T) of
        #{} = Settings -> Settings;
        {error, _} -> #{}
    end.

%% The type's schedules: id, spec, next run and last run.
schedules(T) ->
    case couch_workers:schedules(T) of
        L when is_list(L) -> [maps:with([id, spec, next_run_at, last_run], S) || S <- L];
        {error, _} -> unknown
    end.

counts(T) ->
    case couch_workers:job_counts(T) of
        #{} = Counts -> Counts;
        {error, _} -> #{}
    end.

%% The latest failures: a failed job's `vs' is its failure's commit (an
%% ended job changes no more), so the greatest come last. The failed index
%% is in id order, so at most `?FAILED_READ' of them are read (a bounded
%% read each refresh); `complete' says whether that was all of them.
failures(T) ->
    case couch_workers:job_list(T, #{states => [failed], limit => ?FAILED_READ}) of
        {ok, Jobs, Cont} ->
            Latest = lists:sublist(lists:reverse(lists:keysort(1, [{V, J} || #{vs := V} = J <- Jobs])), ?FAILURES),
            #{jobs => [maps:with([id, error, attempts], J) || {_, J} <- Latest], complete => Cont =:= done};
        {error, _} ->
            unknown
    end.

paused(T) ->
    case couch_workers_ops:job_paused(T) of
        P when is_boolean(P) -> P;
        {error, _} -> unknown
    end.

list_or_empty(L) when is_list(L) -> L;
list_or_empty(_Error) -> [].
