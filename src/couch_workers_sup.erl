%% @doc The couch_workers supervisor.
%%
%% Order matters: the events process starts first and stops last, so that
%% log events of the others are forwarded (the node's too: it starts and
%% stops inside the tree, in `couch_workers_node_sup', which also holds
%% the servers of the node's handles); the status page starts last and
%% stops first.
%%
%% The supervisor owns the ETS tables of `couch_workers_local',
%% `couch_workers_global' and `couch_workers_jobs_subs'
%% (`couch_workers_tables'): a crash of any of them keeps its tables, and
%% its restart restores every registration and subscription from them
%% (or, when the node they were taken on is gone, tells their owners).
-module(couch_workers_sup).

-behaviour(supervisor).

-export([start_link/0]).
-export([init/1]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    ok = couch_workers_tables:create(),
    Flags = #{strategy => one_for_one, intensity => 10, period => 10},
    Children = [
        %% Owns the metrics table (counted into by every other child).
        worker(couch_workers_metrics, 5000),
        worker(couch_workers_events, 5000),
        %% The node, and the servers of its registrations and subscriptions.
        #{
            id => couch_workers_node_sup,
            start => {couch_workers_node_sup, start_link, []},
            restart => permanent,
            shutdown => infinity,
            type => supervisor,
            modules => [couch_workers_node_sup]
        },
        %% The status page (app env `http'; `ignore' when unset). Last:
        %% it reads through the others, and stops first.
        worker(couch_workers_http, 5000)
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
