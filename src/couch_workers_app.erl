%% @doc The couch_workers application.
%%
%% Start: the supervision tree, which starts the node inside it
%% (`couch_workers_node', after the events process, so that the Rust
%% side's log events are forwarded already; the NIF opens the store and
%% starts the reaper). A node that cannot start fails the start with
%% `{node_start_failed, Reason}'. Stop: the tree stops in reverse order,
%% so `couch_workers_local' unregisters its workers while the node still
%% runs, then `couch_workers_node' stops the node (every heartbeat,
%% watcher and the reaper end, the store closes) and waits for it.
%% `stop/1' only stops a node that a killed owner left behind.
-module(couch_workers_app).

-behaviour(application).

-export([start/2, prep_stop/1, stop/1]).
-export([node_config/0, call_timeout/0, call/2, call_successor/2, call_answered/2]).

-include_lib("kernel/include/logger.hrl").

-define(NIF_HINT,
    "the couch_workers NIF is not built: compile the application with "
    "rebar3 or rebar (their pre-compile hook runs scripts/build-nif.sh, "
    "which needs Rust's cargo on the PATH), or run scripts/build-nif.sh "
    "in its source directory").

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    case nif_loaded() of
        ok -> start_tree();
        {error, _} = Error -> Error
    end.

start_tree() ->
    case couch_workers_sup:start_link() of
        {ok, Sup} -> {ok, Sup};
        {error, Reason} -> {error, start_failure(Reason)}
    end.

%% The node's own reason, out of the supervisors' wrapping of it.
start_failure(
    {shutdown,
        {failed_to_start_child, couch_workers_node_sup,
            {shutdown, {failed_to_start_child, couch_workers_node, {shutdown, {node_start_failed, _} = Failed}}}}}
) ->
    Failed;
start_failure(Reason) ->
    Reason.

-spec prep_stop(term()) -> term().
prep_stop(State) ->
    ?LOG_INFO(#{what => couch_workers_stopping}),
    State.

-spec stop(term()) -> ok.
stop(_State) ->
    %% The tree stopped the node; one is left only when its owner was
    %% killed and the supervisors gave up before a successor stopped it.
    couch_workers_node:stop_unowned().

%% @doc The map given to the NIF's `start/2', from the settings
%% (`couch_workers_config': the app env, or CouchDB's ini files).
-spec node_config() -> {ok, map()} | {error, {badconfig, term()}}.
node_config() ->
    Keys = [store, runtime_threads, reaper_max_interval_ms, tx_timeout_ms, embedded_safety_look_ms],
    node_config(Keys, #{}).

node_config([], Config) ->
    {ok, Config};
node_config([Key | Keys], Config) ->
    case couch_workers_config:get(Key) of
        {ok, Value} when Key =:= store -> node_config(Keys, Config#{store => store(Value)});
        {ok, Value} -> node_config(Keys, Config#{Key => Value});
        {error, _} = Error -> Error
    end.

%% @doc How long an API call waits for an answer that needs the store: the
%% store's transaction budget plus a margin.
-spec call_timeout() -> pos_integer().
call_timeout() ->
    case couch_workers_config:get(tx_timeout_ms) of
        {ok, N} when is_integer(N), N > 0 -> N + 5000;
        _ -> 10000
    end.

%% @doc `gen_server:call/3' to one of the app's servers with
%% `call_timeout/0', answering `{error, timeout}', `{error, not_started}'
%% or, when the server crashed before answering, `{error, {server_down,
%% Reason}}', instead of exiting the caller.
-spec call(atom(), term()) -> term().
call(Server, Msg) ->
    try
        gen_server:call(Server, Msg, call_timeout())
    catch
        exit:{timeout, _} -> {error, timeout};
        exit:{noproc, _} -> {error, not_started};
        exit:{shutdown, _} -> {error, not_started};
        exit:{{shutdown, _}, _} -> {error, not_started};
        exit:{normal, _} -> {error, not_started};
        exit:{Reason, {gen_server, call, _}} -> {error, {server_down, Reason}}
    end.

%% @doc `call/2' to the successor of a server that crashed before it
%% answered: waits (up to `call_timeout/0') for the supervisor to have
%% restarted it.
-spec call_successor(atom(), term()) -> term().
call_successor(Server, Msg) ->
    Deadline = erlang:monotonic_time(millisecond) + call_timeout(),
    await_server(Server, Deadline),
    call(Server, Msg).

await_server(Server, Deadline) ->
    case is_pid(whereis(Server)) orelse whereis(couch_workers_sup) =:= undefined of
        true ->
            ok;
        false ->
            case erlang:monotonic_time(millisecond) >= Deadline of
                true ->
                    ok;
                false ->
                    timer:sleep(10),
                    await_server(Server, Deadline)
            end
    end.

%% @doc A call whose answer the caller must have before it goes on (an
%% unsubscribe: the server is the one that delivers, so only its answer
%% says that nothing more comes). Waits as long as the server lives,
%% logging every `call_timeout/0' that it is still waiting; if the server
%% dies meanwhile, asks its restarted successor. `{error, not_started}'
%% only once the application's supervisor is gone (then nothing of the
%% app delivers anything).
-spec call_answered(atom(), term()) -> term().
call_answered(Server, Msg) ->
    case whereis(Server) of
        Pid when is_pid(Pid) ->
            wait_answered(Server, Msg, gen_server:send_request(Pid, Msg), 1);
        undefined ->
            case whereis(couch_workers_sup) of
                undefined ->
                    {error, not_started};
                _ ->
                    %% Being restarted (or stopped with the app).
                    timer:sleep(10),
                    call_answered(Server, Msg)
            end
    end.

wait_answered(Server, Msg, ReqId, Waits) ->
    case gen_server:wait_response(ReqId, call_timeout()) of
        {reply, Reply} ->
            Reply;
        timeout ->
            ?LOG_WARNING(#{what => call_still_waiting, server => Server, waited_ms => Waits * call_timeout()}),
            wait_answered(Server, Msg, ReqId, Waits + 1);
        {error, {_Reason, _ServerRef}} ->
            %% It died before answering: its successor decides.
            call_answered(Server, Msg)
    end.

%% The NIF library is loaded by `couch_workers_nif''s on_load, which
%% fails when the library was never built (a checkout compiled without
%% cargo, a release made without priv/). Say so, and how to fix it,
%% instead of an `undef' from deep inside the start.
nif_loaded() ->
    case code:ensure_loaded(couch_workers_nif) of
        {module, couch_workers_nif} ->
            ok;
        {error, Why} ->
            Lib = couch_workers_nif_lib:file(),
            Reason =
                case filelib:is_regular(Lib) of
                    false -> {nif_not_built, Lib, ?NIF_HINT};
                    true -> {nif_load_failed, Lib, Why}
                end,
            ?LOG_ERROR(#{what => couch_workers_nif_unavailable, reason => Reason}),
            {error, Reason}
    end.

%% Paths go to the NIF as absolute binaries.
store({embedded, Dir}) -> {embedded, path(Dir)};
store({fdb, ClusterFile}) -> {fdb, path(ClusterFile)};
%% The EUnit suites' FoundationDB store (docs/fdb.md, "EUnit against
%% FoundationDB"): its own directory, removed when the app stops; with
%% `shared', another node's, left in place.
store({fdb_test, ClusterFile, Name}) -> {fdb_test, path(ClusterFile), name(Name)};
store({fdb_test, ClusterFile, Name, shared}) -> {fdb_test, path(ClusterFile), name(Name), shared};
store(Other) -> Other.

name(N) when is_list(N) -> unicode:characters_to_binary(N);
name(N) -> N.

path(P) when is_binary(P); is_list(P) ->
    try unicode:characters_to_binary(filename:absname(P)) of
        Bin when is_binary(Bin) -> Bin;
        _ -> P
    catch
        _:_ -> P
    end;
path(P) ->
    P.
