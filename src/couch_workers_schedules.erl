%% @doc Recurring jobs: the calls behind `couch_workers:schedule_set/5',
%% `schedule_remove/2' and `schedules/1', and `types/0' for the status
%% page.
%%
%% A schedule of `JobType' creates, at each due slot `T' (Unix ms), one
%% job of `JobType' with id `<<ScheduleId/binary, "@", T>>', `Info' and the
%% job options of `Opts'. Every node may fire a slot; the store makes sure
%% each slot is fired once (the job is created in the transaction that
%% moves the schedule on). `Spec': `every' (ms, at least 1000) or `cron'
%% (5 fields, UTC), and optionally `start_at' (Unix ms), `overlap'
%% (default `false'), `catch_up' (`latest' (default), `none' or `all').
-module(couch_workers_schedules).

-export([set/5, remove/2, list/1, types/0]).

-spec set(binary(), binary(), map(), map(), map()) -> ok | {error, term()}.
set(Type, Id, Spec, Info, Opts) when is_binary(Type), is_binary(Id), is_map(Spec), is_map(Info), is_map(Opts) ->
    case {couch_workers_leader:fence(Opts), couch_workers_jobs:add_opts(Opts)} of
        {{ok, Fence}, {ok, NifOpts}} ->
            couch_workers_nif:call(fun(Ref) ->
                Args = [Ref, Type, Id, Spec, Info, NifOpts, Fence],
                case erlang:apply(couch_workers_nif, schedule_set, Args) of
                    dirty -> erlang:apply(couch_workers_nif, schedule_set_dirty, Args);
                    Answer -> Answer
                end
            end);
        {{error, _} = Error, _} ->
            Error;
        {_, {error, _} = Error} ->
            Error
    end;
set(_Type, _Id, _Spec, _Info, _Opts) ->
    erlang:error(badarg).

-spec remove(binary(), binary()) -> ok | {error, not_found | term()}.
remove(Type, Id) when is_binary(Type), is_binary(Id) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:schedule_remove(Ref, Type, Id) end);
remove(_Type, _Id) ->
    erlang:error(badarg).

-spec list(binary()) -> [map()] | {error, term()}.
list(Type) when is_binary(Type) ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:schedules(Ref, Type) end) of
        {ok, Entries} -> [entry(E) || E <- Entries];
        {error, _} = Error -> Error
    end;
list(_Type) ->
    erlang:error(badarg).

%% @doc The job types that have at least one schedule, in byte order, read
%% from the schedules themselves: a type scheduled before any of its jobs
%% exist is among them (`couch_workers:job_types/0' knows only types with
%% jobs).
-spec types() -> [binary()] | {error, term()}.
types() ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:schedule_types(Ref) end) of
        {ok, Types} -> Types;
        {error, _} = Error -> Error
    end.

%% The NIF's entry with the spec's keys as atoms (as `schedule_set/5'
%% takes them) and the options given as a map.
entry(#{spec := Spec, opts := {Priority, MaxAttempts, Keep, Group, ActivityTimeout}} = E) ->
    Given = [
        {priority, Priority},
        {max_attempts, MaxAttempts},
        {keep, Keep},
        {group, Group},
        {activity_timeout, ActivityTimeout}
    ],
    Opts = maps:from_list([{K, V} || {K, V} <- Given, V =/= undefined]),
    E#{spec := spec(Spec), opts := Opts}.

spec(Spec) ->
    maps:from_list([spec_field(K, V) || {K, V} <- maps:to_list(Spec)]).

spec_field(<<"catch_up">>, V) -> {catch_up, binary_to_atom(V)};
spec_field(<<"every">>, V) -> {every, V};
spec_field(<<"cron">>, V) -> {cron, V};
spec_field(<<"start_at">>, V) -> {start_at, V};
spec_field(<<"overlap">>, V) -> {overlap, V}.
