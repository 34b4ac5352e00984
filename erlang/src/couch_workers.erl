%% @doc couch_workers: workers, their membership, and (issue 4) a job
%% queue, for CouchDB nodes that share one store. See DESIGN.md, "Erlang
%% API", for the contract.
%%
%% Every call that returns has finished its write: what it wrote is
%% visible to every node. Bad shapes (a non-binary type or id, non-map
%% options, a non-pid) raise `badarg'; options that JSON cannot hold are
%% `{error, invalid_options}', a bad `timeout' `{error, invalid_timeout}',
%% keys and values over FoundationDB's limits `{error, key_too_large}' and
%% `{error, value_too_large}'. Unknown or stale references are `ok'.
-module(couch_workers).

-export([
    worker_register/4,
    worker_unregister/1,
    membership_subscribe/3,
    membership_unsubscribe/1,
    get_workers/1,
    stats/0
]).

-export_type([worker_type/0, worker_id/0, workers/0, vs/0]).

-type worker_type() :: binary().
-type worker_id() :: binary().
%% Options of each live worker, decoded from JSON (binary keys).
-type workers() :: #{worker_id() => map()}.
%% A versionstamp: opaque; a later one compares greater.
-type vs() :: binary().

%% Called (in a process of the subscription's own) on every membership
%% change of a subscription made with a module.
-callback couch_workers_membership_update(
    WorkerType :: worker_type(), Workers :: workers(), VS :: vs(), Ref :: reference()
) -> any().

%% @doc Registers worker `Id' of `WorkerType' for `Pid'. `Opts' (a map
%% JSON can hold) is what other nodes see; its `timeout' (atom or binary
%% key; a positive integer, seconds; default 15) is the health timeout.
%% The same `(WorkerType, Id)' registered again from this node returns the
%% same `Ref'. When `Pid' exits, the worker is unregistered.
-spec worker_register(worker_type(), worker_id(), map(), pid()) -> reference() | {error, term()}.
worker_register(WorkerType, Id, Opts, Pid) when
    is_binary(WorkerType), is_binary(Id), is_map(Opts), is_pid(Pid)
->
    case couch_workers_local:register_worker(WorkerType, Id, Opts, Pid) of
        {error, badarg} -> erlang:error(badarg);
        Result -> Result
    end;
worker_register(_WorkerType, _Id, _Opts, _Pid) ->
    erlang:error(badarg).

%% @doc Removes the worker of `Ref' (unknown or stale `Ref': `ok').
-spec worker_unregister(reference()) -> ok | {error, timeout}.
worker_unregister(Ref) when is_reference(Ref) ->
    couch_workers_local:unregister_worker(Ref);
worker_unregister(_Ref) ->
    ok.

%% @doc Subscribes `Pid' to the membership of `WorkerType': with `Module'
%% each change is a call of `Module:couch_workers_membership_update/4',
%% with `nil' the message `{couch_workers_membership, WorkerType, Workers,
%% VS, Ref}' to `Pid'. The current membership comes once right away (also
%% `#{}'). `Pid' owns the subscription: its exit ends it.
-spec membership_subscribe(worker_type(), nil | module(), pid()) -> reference() | {error, term()}.
membership_subscribe(WorkerType, Module, Pid) when
    is_binary(WorkerType), is_atom(Module), is_pid(Pid)
->
    couch_workers_global:subscribe(WorkerType, Module, Pid);
membership_subscribe(_WorkerType, _Module, _Pid) ->
    erlang:error(badarg).

%% @doc Ends a subscription: no delivery for `Ref' arrives after this
%% returns (deliveries already in the caller's mailbox are flushed).
-spec membership_unsubscribe(reference()) -> ok.
membership_unsubscribe(Ref) when is_reference(Ref) ->
    ok = couch_workers_global:unsubscribe(Ref),
    flush_membership(Ref);
membership_unsubscribe(_Ref) ->
    ok.

%% @doc The node-local membership of `WorkerType' as last delivered;
%% `not_found' when no subscription on this node covers it.
-spec get_workers(worker_type()) -> {ok, vs(), workers()} | {error, not_found}.
get_workers(WorkerType) ->
    couch_workers_global:get_workers(WorkerType).

%% @doc Live counts of the Rust side: `heartbeats', `watchers', `reapers'
%% (tasks of the running node), `registrations' and `watches' (live NIF
%% handles), `running', `runtime_threads'.
-spec stats() -> #{atom() => term()}.
stats() ->
    couch_workers_nif:stats().

flush_membership(Ref) ->
    receive
        {couch_workers_membership, _Type, _Workers, _VS, Ref} -> flush_membership(Ref)
    after 0 -> ok
    end.
