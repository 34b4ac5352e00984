%% @doc What the status page shows, gathered in one place for its HTML
%% (`couch_workers_status_page') and its JSON (`/api/status'): per worker
%% type the live workers (cluster-wide, from the store), per job type its
%% counts, latest failures and paused flag as far as the job API offers
%% them, and this node's throughput history.
%%
%% The job API grows (`job_types/0', `job_counts/1', `job_list/2' and
%% pausing are being added): each is used when `couch_workers' exports
%% it, and until then the page says what it cannot show (`unknown')
%% rather than guess. Job types without `job_types/0' are those of the
%% worker types and of this node's metrics.
-module(couch_workers_status).

-export([collect/1]).

%% Workers listed per type (the count says how many there are).
-define(MAX_LISTED, 200).
%% Latest failures listed per job type.
-define(FAILURES, 5).

%% @doc The status; `History' is the throughput history
%% (`couch_workers_http:history/0').
-spec collect(map()) -> map().
collect(History) ->
    WorkerTypes = list_or_empty(couch_workers:worker_types()),
    Metrics = couch_workers:metrics(),
    #{
        node => node(),
        worker_types => [worker_type(T) || T <- WorkerTypes],
        job_types => [job_type(T, History) || T <- job_types(WorkerTypes, Metrics)],
        metrics => Metrics
    }.

worker_type(T) ->
    Workers = list_or_empty(couch_workers:workers(T)),
    #{type => T, total => length(Workers), workers => lists:sublist(Workers, ?MAX_LISTED)}.

job_types(WorkerTypes, #{types := Seen}) ->
    case exported(job_types, 0) of
        true -> list_or_empty(couch_workers:job_types());
        false -> lists:usort(WorkerTypes ++ maps:keys(Seen))
    end.

job_type(T, History) ->
    #{
        type => T,
        counts => counts(T),
        failures => failures(T),
        paused => paused(T),
        throughput => maps:get(T, History, [])
    }.

counts(T) ->
    case exported(job_counts, 1) of
        true ->
            couch_workers:job_counts(T);
        false ->
            case couch_workers:job_pending_count(T) of
                N when is_integer(N) -> #{pending => N};
                {error, _} -> #{}
            end
    end.

failures(T) ->
    case exported(job_list, 2) of
        true ->
            case couch_workers:job_list(T, #{states => [failed], limit => ?FAILURES}) of
                {ok, Jobs, _Cont} -> [maps:with([id, error, attempts], J) || J <- Jobs];
                {error, _} -> unknown
            end;
        false ->
            unknown
    end.

paused(T) ->
    case exported(job_paused, 1) of
        true -> couch_workers:job_paused(T);
        false -> unknown
    end.

exported(F, A) ->
    erlang:function_exported(couch_workers, F, A).

list_or_empty(L) when is_list(L) -> L;
list_or_empty(_Error) -> [].
