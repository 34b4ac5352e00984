%% @doc Leadership of a worker type: the calls behind `couch_workers:leader/1'
%% and the `if_leader' option of `job_add/4' and `job_resubmit/4'.
%%
%% The leader of a worker type is its member with the oldest current
%% registration, read from the store. Its owner is told
%% `{couch_workers_leader, Ref, Epoch}' when it becomes leader and
%% `{couch_workers_leader_lost, Ref, Epoch}' when it stops (the NIF sends
%% both, set up with the registration's other owner events by
%% `couch_workers_nif:worker_notify/3'). `if_leader => {WorkerType, Epoch}'
%% writes only while `Epoch' is still the type's leadership, checked in
%% the writing transaction.
-module(couch_workers_leader).

-export([leader/1, fence/1, add/5, resubmit/6]).

%% @doc `{ok, Id, Epoch}' of the type's leader, or `{error, not_found}'.
-spec leader(binary()) -> {ok, binary(), binary()} | {error, term()}.
leader(WorkerType) when is_binary(WorkerType) ->
    couch_workers_nif:call(fun(Ref) -> couch_workers_nif:leader(Ref, WorkerType) end);
leader(_WorkerType) ->
    erlang:error(badarg).

%% @doc The `if_leader' option (atom or binary key): `{ok, undefined}'
%% when not given, `{ok, {WorkerType, Epoch}}', or `{error,
%% invalid_if_leader}' for any other value.
-spec fence(map()) -> {ok, undefined | {binary(), binary()}} | {error, invalid_if_leader}.
fence(Opts) ->
    case maps:get(if_leader, Opts, maps:get(<<"if_leader">>, Opts, undefined)) of
        undefined -> {ok, undefined};
        {WorkerType, Epoch} = Fence when is_binary(WorkerType), is_binary(Epoch) -> {ok, Fence};
        _ -> {error, invalid_if_leader}
    end.

%% @doc `job_add' with the NIF's options, fenced by `Fence'.
-spec add(binary(), binary(), map(), couch_workers_nif:job_opts(), {binary(), binary()}) -> ok | {error, term()}.
add(Type, Id, Info, NifOpts, Fence) ->
    budgeted(job_add_if_leader, job_add_if_leader_dirty, [Type, Id, Info, NifOpts, Fence]).

%% @doc `job_resubmit' with the NIF's options and `if_vs', fenced by `Fence'.
-spec resubmit(binary(), binary(), map(), couch_workers_nif:job_opts(), binary() | undefined, {binary(), binary()}) ->
    ok | {error, term()}.
resubmit(Type, Id, Info, NifOpts, IfVs, Fence) ->
    budgeted(job_resubmit_if_leader, job_resubmit_if_leader_dirty, [Type, Id, Info, NifOpts, IfVs, Fence]).

%% As `couch_workers_nif:budgeted/2': the normal NIF, then its DirtyCpu
%% twin when the info is too big to convert on a normal scheduler.
budgeted(Nif, Dirty, Args) ->
    couch_workers_nif:call(fun(Ref) ->
        case erlang:apply(couch_workers_nif, Nif, [Ref | Args]) of
            dirty -> erlang:apply(couch_workers_nif, Dirty, [Ref | Args]);
            Answer -> Answer
        end
    end).
