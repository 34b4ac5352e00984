%% @doc What every couch_workers gen_server does with a message it does not
%% know: log it once as a warning, naming the server, and carry on. A call
%% is answered `{error, {bad_call, Msg}}' so that its caller does not wait
%% out its timeout; a cast or a stray message is dropped (a crash would
%% only lose the server's state for a message nobody meant for it).
%%
%% Used from the last clause of `handle_call/3', `handle_cast/2' and
%% `handle_info/2':
%% ```
%% handle_call(Msg, _From, St) -> couch_workers_server:unknown_call(?MODULE, Msg, St).
%% '''
-module(couch_workers_server).

-export([unknown_call/3, unknown_cast/3, unknown_info/3]).

-include_lib("kernel/include/logger.hrl").

-spec unknown_call(module(), term(), State) -> {reply, {error, {bad_call, term()}}, State}.
unknown_call(Server, Msg, St) ->
    ?LOG_WARNING(#{what => unknown_call, server => Server, msg => Msg}),
    {reply, {error, {bad_call, Msg}}, St}.

-spec unknown_cast(module(), term(), State) -> {noreply, State}.
unknown_cast(Server, Msg, St) ->
    ?LOG_WARNING(#{what => unknown_cast, server => Server, msg => Msg}),
    {noreply, St}.

-spec unknown_info(module(), term(), State) -> {noreply, State}.
unknown_info(Server, Msg, St) ->
    ?LOG_WARNING(#{what => unknown_info, server => Server, msg => Msg}),
    {noreply, St}.
