%% @doc The owner of this VM's node: the Rust node started through the
%% NIF (`couch_workers_nif:start/2'), which opens the store and runs the
%% heartbeats, watchers and the reaper.
%%
%% The node lives as long as this process: `init/1' starts it and waits
%% for the store to open (a failure fails the start of the application);
%% a stop by the supervisor (`shutdown') stops it and waits for every
%% task of it to end. `couch_workers_node_sup' starts the servers that
%% hold the node's handles after this process, `rest_for_one': when this
%% process dies they are stopped first (unregistering their workers, and
%% telling the owners) and started again on the new node.
%%
%% A crash, or `exit(Pid, kill)' (no terminate then), leaves the node
%% running without an owner, so that the servers stopped after this
%% process can still write their removals; the successor's `init/1' stops
%% that node before it starts its own, so that every start of this
%% process is a new node (logged `couch_workers_node_unowned_stopped').
%% When no successor comes (the supervisors gave up),
%% `couch_workers_app:stop/1' stops it.
-module(couch_workers_node).

-behaviour(gen_server).

-export([start_link/0, owner/0, claim/1, stop_unowned/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

%% Beyond the store's own budget: how long a start or a stop of the node
%% may take.
-define(NODE_TIMEOUT_MS, 30000).

%% `couch_workers_tables': which owner's node each handle table's rows
%% were taken on.
-define(MARKS, couch_workers_node_marks).

%% ---- API -----------------------------------------------------------------

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc The process that owns the running node, `undefined' when there is
%% none. Each start of the owner is a new node: handles (registrations,
%% subscriptions) taken under one owner are void under another.
-spec owner() -> pid() | undefined.
owner() ->
    whereis(?MODULE).

%% @doc Whether the NIF handles kept in `Table' (rows of a server that
%% crashed) were taken on the running node: `current', or `gone' when
%% they were taken on a node that has stopped since (its handles are
%% void). Marks the table as the running node's from then on. Called by
%% the servers that keep handles, when they start.
-spec claim(atom()) -> current | gone.
claim(Table) ->
    Owner = owner(),
    Mark = ets:lookup(?MARKS, Table),
    true = ets:insert(?MARKS, {Table, Owner}),
    case Mark of
        [{Table, Owner}] -> current;
        [] -> current;
        [{Table, _Other}] -> gone
    end.

%% @doc Stops a node that runs without a live owner (its owner was killed)
%% and waits for it; `ok' at once when no node runs.
-spec stop_unowned() -> ok.
stop_unowned() ->
    stop_unowned(erlang:monotonic_time(millisecond) + ?NODE_TIMEOUT_MS).

%% ---- gen_server ----------------------------------------------------------

-spec init([]) -> {ok, #{}} | {stop, {shutdown, {node_start_failed, term()}}}.
init([]) ->
    %% Trapped so that a stop by the supervisor runs terminate/2.
    process_flag(trap_exit, true),
    ok = stop_unowned(),
    case start_node() of
        ok ->
            {ok, #{}};
        {error, Reason} ->
            %% `shutdown': the failure is the start's answer (and logged),
            %% not a crash to report.
            {stop, {shutdown, {node_start_failed, Reason}}}
    end.

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
terminate(Reason, _St) when
    Reason =:= shutdown; Reason =:= normal; is_tuple(Reason), element(1, Reason) =:= shutdown
->
    stop_node();
terminate(Reason, _St) ->
    %% A crash: the servers stopped after this one still need the node
    %% for their removals; the successor stops it.
    ?LOG_ERROR(#{what => couch_workers_node_owner_crashed, reason => Reason}),
    ok.

%% ---- internal ------------------------------------------------------------

start_node() ->
    case couch_workers_app:node_config() of
        {ok, Config} ->
            start_node(Config);
        {error, Reason} ->
            ?LOG_ERROR(#{what => couch_workers_node_start_failed, reason => Reason}),
            {error, Reason}
    end.

start_node(Config) ->
    case couch_workers_fdb_client:prepare(maps:get(store, Config, undefined)) of
        ok ->
            start_nif(Config);
        {error, Reason} ->
            ?LOG_ERROR(#{what => couch_workers_node_start_failed, reason => Reason, config => Config}),
            {error, Reason}
    end.

start_nif(Config) ->
    Ref = make_ref(),
    Result =
        case couch_workers_nif:start(Ref, Config#{node_name => tx_counts_name()}) of
            ok -> couch_workers_nif:wait(Ref, ?NODE_TIMEOUT_MS);
            {error, _} = Error -> Error
        end,
    case Result of
        ok ->
            ?LOG_INFO(#{what => couch_workers_node_started, config => Config}),
            ok;
        {error, Reason} ->
            ?LOG_ERROR(#{what => couch_workers_node_start_failed, reason => Reason, config => Config}),
            {error, Reason}
    end.

%% The name this node's job calls in callers' transactions are counted
%% under (docs/api.md): the Erlang node's, the same across restarts, so
%% that the store keeps one set of counts per node. A node that is not
%% distributed is `nonode@nohost' like every other such node: it gets a
%% name of its own for this start (its counts are then one set per start).
tx_counts_name() ->
    case node() of
        nonode@nohost ->
            iolist_to_binary([
                "nonode@nohost/", os:getpid(), "/", integer_to_list(erlang:system_time(microsecond))
            ]);
        Node ->
            atom_to_binary(Node)
    end.

stop_node() ->
    Ref = make_ref(),
    case couch_workers_nif:stop(Ref) of
        ok ->
            case couch_workers_nif:wait(Ref, ?NODE_TIMEOUT_MS) of
                ok -> ?LOG_INFO(#{what => couch_workers_node_stopped});
                Error -> ?LOG_ERROR(#{what => couch_workers_node_stop_failed, reason => Error})
            end;
        {error, Reason} ->
            %% Stopped under the app (`couch_workers_nif:stop/1' called
            %% directly): nothing left to stop.
            ?LOG_WARNING(#{what => couch_workers_node_not_running, reason => Reason})
    end,
    ok.

%% A start or a stop of the node still under way (its owner was killed
%% in the middle of it) is waited for: then there is a node to stop, or
%% none.
stop_unowned(Deadline) ->
    Ref = make_ref(),
    case couch_workers_nif:stop(Ref) of
        ok ->
            Result = couch_workers_nif:wait(Ref, ?NODE_TIMEOUT_MS),
            ?LOG_WARNING(#{what => couch_workers_node_unowned_stopped, result => Result}),
            ok;
        {error, not_started} ->
            ok;
        {error, Busy} when Busy =:= starting; Busy =:= stopping ->
            case erlang:monotonic_time(millisecond) < Deadline of
                true ->
                    timer:sleep(10),
                    stop_unowned(Deadline);
                false ->
                    ?LOG_ERROR(#{what => couch_workers_node_unowned_stop_failed, reason => Busy}),
                    ok
            end
    end.
