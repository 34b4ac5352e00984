%% @doc Lets erlfdb own the VM's FoundationDB client when both run.
%%
%% libfdb_c is one per OS process: `fdb_select_api_version' and
%% `fdb_setup_network' succeed once. erlfdb selects and sets up in
%% `erlfdb_nif''s on_load and fails to load when someone was first
%% (`ok = select_api_version(Vsn)' meets `{error, 2201}'), which would
%% leave CouchDB without FoundationDB. couch_workers' FDB store uses a
%% client that is already there (it sees 2201 / 2009 and shares it), so
%% erlfdb must be loaded first: `prepare/1' loads `erlfdb_nif' before the
%% node opens an FDB store, whatever order the applications start in.
%%
%% The API version is erlfdb's then; couch_workers is built against 710
%% and refuses an erlfdb configured for less (`{erlfdb, [{api_version, V}]}'),
%% or left to its default, which differs between erlfdb forks (see
%% docs/fdb.md).
-module(couch_workers_fdb_client).

-export([prepare/1, decide/2]).

%% couch_workers' FDB store is built against FoundationDB API version 710.
-define(API_VERSION, 710).

-type store() ::
    {embedded, binary() | string()}
    | {fdb, binary() | string()}
    | {fdb_test, binary() | string(), binary() | string()}
    | {fdb_test, binary() | string(), binary() | string(), shared}
    | term().
-type erlfdb() :: absent | {present, undefined | {ok, term()}}.

%% @doc Before the node opens `Store': with an FDB store and erlfdb in the
%% code path, loads `erlfdb_nif' (so erlfdb selects the API version and
%% starts the network), after checking its API version.
-spec prepare(store()) -> ok | {error, term()}.
prepare(Store) ->
    Erlfdb =
        case code:which(erlfdb_nif) of
            non_existing -> absent;
            _ -> {present, application:get_env(erlfdb, api_version)}
        end,
    case decide(Store, Erlfdb) of
        ok -> ok;
        load_erlfdb -> load_erlfdb();
        {error, _} = Error -> Error
    end.

%% @doc The pure half of `prepare/1': what to do for `Store' given whether
%% erlfdb is there and its `api_version' setting.
-spec decide(store(), erlfdb()) -> ok | load_erlfdb | {error, term()}.
decide({fdb_test, ClusterFile, _Name}, Erlfdb) ->
    decide({fdb, ClusterFile}, Erlfdb);
decide({fdb_test, ClusterFile, _Name, shared}, Erlfdb) ->
    decide({fdb, ClusterFile}, Erlfdb);
decide({fdb, _}, absent) ->
    ok;
decide({fdb, _}, {present, {ok, V}}) when is_integer(V), V >= ?API_VERSION ->
    load_erlfdb;
decide({fdb, _}, {present, Setting}) ->
    {error,
        {erlfdb_api_version, setting(Setting),
            "erlfdb owns this VM's FoundationDB client and its API version is couch_workers' too: "
            "couch_workers needs 710 or newer, set {erlfdb, [{api_version, 710}]}"}};
decide(_Embedded, _Erlfdb) ->
    ok.

setting(undefined) -> erlfdb_default;
setting({ok, V}) -> V.

load_erlfdb() ->
    case code:ensure_loaded(erlfdb_nif) of
        {module, erlfdb_nif} -> ok;
        {error, Why} -> {error, {erlfdb_load_failed, Why}}
    end.
