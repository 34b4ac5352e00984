%% @doc What the benchmark runs on node B, a second `erl' OS process
%% started with OTP's `peer' (connection `standard_io', as in
%% test/couch_workers_multinode_tests.erl) that shares node A's store
%% (the same embedded directory, or the same FoundationDB cluster and
%% directory). Called through `peer:call/5'; answers plain terms only
%% (references do not travel between non-distributed nodes).
-module(cw_bench_peer).

-export([start/1, register_timed/3, register_owned/3, leave/1]).

%% Starts couch_workers on node A's store: `Store' is its app env `store'
%% (cw_bench_wl:store/1), or a bare directory for the embedded store.
-spec start(tuple() | string()) -> ok.
start(Store) ->
    ok = application:load(couch_workers),
    ok = logger:set_primary_config(level, warning),
    ok = application:set_env(couch_workers, store, case is_tuple(Store) of true -> Store; false -> {embedded, Store} end),
    {ok, _} = application:ensure_all_started(couch_workers),
    ok.

%% Registers worker `Id' in a new long-lived process of B (its owner) and
%% returns `{ok, T}', T the OS wall clock (os:system_time(microsecond),
%% CLOCK_REALTIME, one clock for every process of the host) read right
%% after worker_register/4 returned in that process.
-spec register_timed(binary(), binary(), map()) -> {ok, integer()} | {error, term()}.
register_timed(Type, Id, Opts) ->
    Caller = self(),
    spawn(fun() ->
        Result = couch_workers:worker_register(Type, Id, Opts, self()),
        T = os:system_time(microsecond),
        persistent_term:put({cw_bench_owner, Id}, self()),
        Caller ! {registered, self(), Result, T},
        receive stop -> ok end
    end),
    receive
        {registered, _, Ref, T} when is_reference(Ref) -> {ok, T};
        {registered, _, Error, _} -> {error, Error}
    after 30000 -> {error, timeout}
    end.

%% Registers `Id' in a long-lived owner process; `ok' or the error.
-spec register_owned(binary(), binary(), map()) -> ok | {error, term()}.
register_owned(Type, Id, Opts) ->
    case register_timed(Type, Id, Opts) of
        {ok, _} -> ok;
        Error -> Error
    end.

%% Ends the owner process of `Id' (registered by register_timed/3): the
%% worker leaves (couch_workers unregisters it when its pid exits).
-spec leave(binary()) -> ok.
leave(Id) ->
    case persistent_term:get({cw_bench_owner, Id}, undefined) of
        undefined -> ok;
        Pid -> Pid ! stop, ok
    end.
