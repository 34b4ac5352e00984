%% @doc Operations' reads: the worker types and workers of the whole
%% cluster, read from the store (no subscription, no node-local cache), for
%% `couch_workers:worker_types/0' and `workers/1' and the status page; and
%% a job type's paused flag for the status page (the public API writes it,
%% with `job_pause/1' and `job_resume/1', but has no call that reads it).
%%
%% Each call is one read-only transaction of snapshot reads on the Rust
%% runtime (it conflicts with no node's writes); the reply is built off
%% the schedulers. Cost: `bench/RESULTS.md' ("Operations' reads").
-module(couch_workers_ops).

-export([worker_types/0, workers/1, job_paused/1]).

-type worker_info() :: #{
    id := binary(),
    opts := map(),
    timeout := pos_integer() | null,
    heartbeat_age_ms := non_neg_integer() | null,
    running := non_neg_integer()
}.
-export_type([worker_info/0]).

%% @doc The worker types that have registered workers now, in byte order.
-spec worker_types() -> [binary()] | {error, term()}.
worker_types() ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:ops_worker_types(Ref) end) of
        {ok, Types} -> Types;
        {error, _} = Error -> Error
    end.

%% @doc Every registered worker of `Type', in id order, cluster-wide.
-spec workers(binary()) -> [worker_info()] | {error, term()}.
workers(Type) when is_binary(Type) ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:ops_workers(Ref, Type) end) of
        {ok, Workers} -> Workers;
        {error, _} = Error -> Error
    end;
workers(_Type) ->
    erlang:error(badarg).

%% @doc Whether `Type' is paused, cluster-wide (one read of the flag that
%% `couch_workers:job_pause/1' sets).
-spec job_paused(binary()) -> boolean() | {error, term()}.
job_paused(Type) when is_binary(Type) ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:ops_job_paused(Ref, Type) end) of
        {ok, Paused} -> Paused;
        {error, _} = Error -> Error
    end;
job_paused(_Type) ->
    erlang:error(badarg).

