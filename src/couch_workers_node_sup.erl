%% @doc The node and the servers that hold its handles, supervised as one
%% group (a child of `couch_workers_sup').
%%
%% ```
%% couch_workers_node_sup      rest_for_one
%%   couch_workers_node        owns the node (start, stop)
%%   couch_workers_handles_sup one_for_one
%%     couch_workers_global    membership watches
%%     couch_workers_local     registrations
%%     couch_workers_jobs_subs job subscriptions
%% '''
%%
%% `rest_for_one' because every handle belongs to the node it was taken
%% on: when `couch_workers_node' dies, the handle servers are stopped
%% (`shutdown': `couch_workers_local' unregisters its workers, on the old
%% node, which a killed owner left running, and tells their owners) and
%% started again after the new node. The handle servers sit under a
%% `one_for_one' supervisor of their own so that a crash of one restarts
%% that one alone: a `rest_for_one' over all four would stop the servers
%% after a crashed one with `shutdown', and a stopped `couch_workers_local'
%% unregisters every worker (a crash keeps them, see `couch_workers_tables').
%%
%% The application stops them in reverse: the handle servers first (the
%% removals are written while the node runs), then the node.
-module(couch_workers_node_sup).

-behaviour(supervisor).

-export([start_link/0, start_link/1]).
-export([init/1]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, node).

%% @doc The supervisor of the handle servers (the second child of the group).
-spec start_link(handles) -> {ok, pid()} | ignore | {error, term()}.
start_link(handles) ->
    supervisor:start_link({local, couch_workers_handles_sup}, ?MODULE, handles).

-spec init(node | handles) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init(node) ->
    Flags = #{strategy => rest_for_one, intensity => 10, period => 10},
    Children = [
        %% Stopping the node waits for every task of it (and the store).
        worker(couch_workers_node, 60000),
        #{
            id => couch_workers_handles_sup,
            start => {?MODULE, start_link, [handles]},
            restart => permanent,
            shutdown => infinity,
            type => supervisor,
            modules => [?MODULE]
        }
    ],
    {ok, {Flags, Children}};
init(handles) ->
    Flags = #{strategy => one_for_one, intensity => 10, period => 10},
    Children = [
        worker(couch_workers_global, 5000),
        %% Unregistering every worker takes a store transaction each.
        worker(couch_workers_local, 30000),
        %% Job subscriptions (stops first: its subscriptions end).
        worker(couch_workers_jobs_subs, 5000)
    ],
    {ok, {Flags, Children}}.

worker(Module, Shutdown) ->
    #{
        id => Module,
        start => {Module, start_link, []},
        restart => permanent,
        shutdown => Shutdown,
        type => worker,
        modules => [Module]
    }.
