%% @doc Forwards the Rust side's log events to `logger'.
%%
%% The NIF sends `{couch_workers_log, Level, What, Fields}' (Fields: a map
%% with atom keys) to this process, which calls
%% `logger:log(Level, Fields#{what => What})' (no logger domain: the
%% default handler drops events of domains it does not know), with the
%% metadata `#{source => couch_workers_nif}'.
-module(couch_workers_events).

-behaviour(gen_server).

-export([start_link/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(LEVELS, [emergency, alert, critical, error, warning, notice, info, debug]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec init([]) -> {ok, #{}}.
init([]) ->
    process_flag(trap_exit, true),
    ok = couch_workers_nif:set_log_pid(self()),
    {ok, #{}}.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, term(), map()}.
handle_call(Msg, _From, St) ->
    couch_workers_server:unknown_call(?MODULE, Msg, St).

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(Msg, St) ->
    couch_workers_server:unknown_cast(?MODULE, Msg, St).

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info({couch_workers_log, Level, What, Fields}, St) when is_map(Fields) ->
    Level1 =
        case lists:member(Level, ?LEVELS) of
            true -> Level;
            false -> notice
        end,
    logger:log(Level1, Fields#{what => What}, #{source => couch_workers_nif}),
    couch_workers_observe:log_event(What, Fields),
    {noreply, St};
handle_info(Msg, St) ->
    couch_workers_server:unknown_info(?MODULE, Msg, St).

-spec terminate(term(), map()) -> ok.
terminate(_Reason, _St) ->
    couch_workers_nif:set_log_pid(undefined),
    ok.
