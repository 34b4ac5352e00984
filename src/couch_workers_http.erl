%% @doc The status page's listener: with the app env `http' set to
%% `#{port => Port}' (and optionally `ip => IpTuple', default 127.0.0.1:
%% never beyond loopback unless said), an OTP `inets' httpd serves
%% `couch_workers_http_handler' on that address. Off by default: without
%% `http' this child is `ignore' and nothing listens.
%%
%% This server owns the httpd instance (started under `inets', linked
%% here, stopped in `terminate/2') and keeps the throughput history the
%% page charts: every `?SAMPLE_MS' the job counters of this node's
%% metrics, per type, the last `?SAMPLES' of them.
%%
%% `Port' 0 takes a free port (tests); `port/0' tells which.
-module(couch_workers_http).

-behaviour(gen_server).

-export([start_link/0, port/0, history/0, parse_config/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-define(SAMPLE_MS, 10000).
%% Names this app's httpd instance among the VM's (CouchDB runs others).
-define(SERVER_NAME, "couch_workers_status").
%% Ten minutes of samples.
-define(SAMPLES, 60).

-record(st, {
    httpd :: pid(),
    port :: inet:port_number(),
    %% Type => [{UnixMs, Finished, Added}], newest first
    history = #{} :: #{binary() => [{integer(), non_neg_integer(), non_neg_integer()}]}
}).

%% @doc Starts the listener when `http' is set; `ignore' when it is not.
-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    case application:get_env(couch_workers, http) of
        undefined ->
            ignore;
        {ok, Value} ->
            case parse_config(Value) of
                {ok, Config} -> gen_server:start_link({local, ?MODULE}, ?MODULE, Config, []);
                error -> {error, {badconfig, {http, Value}}}
            end
    end.

%% @doc `#{port := 0..65535, ip => IpTuple}' checked, with the default ip.
-spec parse_config(term()) -> {ok, #{port := inet:port_number(), ip := inet:ip_address()}} | error.
parse_config(#{port := Port} = Map) when is_integer(Port), Port >= 0, Port =< 65535 ->
    Ip = maps:get(ip, Map, {127, 0, 0, 1}),
    case maps:keys(maps:without([port, ip], Map)) =:= [] andalso is_ip(Ip) of
        true -> {ok, #{port => Port, ip => Ip}};
        false -> error
    end;
parse_config(_) ->
    error.

is_ip(Ip) when is_tuple(Ip) ->
    inet:ntoa(Ip) =/= {error, einval};
is_ip(_) ->
    false.

%% @doc The port the listener is bound to; `undefined' when none runs.
-spec port() -> inet:port_number() | undefined.
port() ->
    try
        gen_server:call(?MODULE, port, 5000)
    catch
        exit:_ -> undefined
    end.

%% @doc The throughput history: `#{Type => [{UnixMs, Finished, Added}]}',
%% oldest first (this node's counters at each sample).
-spec history() -> #{binary() => [{integer(), non_neg_integer(), non_neg_integer()}]}.
history() ->
    try
        gen_server:call(?MODULE, history, 5000)
    catch
        exit:_ -> #{}
    end.

%% ---- gen_server ------------------------------------------------------------

-spec init(map()) -> {ok, #st{}} | {stop, term()}.
init(#{port := Port, ip := Ip}) ->
    process_flag(trap_exit, true),
    case application:ensure_all_started(inets) of
        {ok, _} ->
            stop_leftovers(),
            Root = code:priv_dir(couch_workers),
            Config = [
                {port, Port},
                {bind_address, Ip},
                {ipfamily, family(Ip)},
                {server_name, ?SERVER_NAME},
                {server_root, Root},
                {document_root, Root},
                {modules, [couch_workers_http_handler]},
                {keep_alive, false}
            ],
            case inets:start(httpd, Config) of
                {ok, Pid} ->
                    %% Its exit stops this server (and the supervisor
                    %% restarts both); this server's stop stops it.
                    link(Pid),
                    [{port, Bound}] = httpd:info(Pid, [port]),
                    ?LOG_NOTICE(#{what => status_page_listening, ip => inet:ntoa(Ip), port => Bound}),
                    St = sample(#st{httpd = Pid, port = Bound}),
                    erlang:send_after(?SAMPLE_MS, self(), sample),
                    {ok, St};
                {error, Reason} ->
                    ?LOG_ERROR(#{what => status_page_listen_failed, ip => inet:ntoa(Ip), port => Port, reason => Reason}),
                    {stop, {http_listen_failed, Reason}}
            end;
        {error, Reason} ->
            ?LOG_ERROR(#{what => status_page_needs_inets, reason => Reason}),
            {stop, {inets_not_started, Reason}}
    end.

%% An instance of an earlier incarnation of this server that was killed
%% (`terminate/2' did not run) still listens: inets supervises it, and a
%% supervisor outlives a linked process that is not its parent. Stop it
%% before binding again, or the port stays taken.
%% (A leftover that went away meanwhile answers `{error, not_started}':
%% ignored, as is any other failure to stop it, since the bind that
%% follows fails and says so if the port is still taken.)
stop_leftovers() ->
    lists:foreach(
        fun(Pid) ->
            ?LOG_NOTICE(#{what => status_page_leftover_stopped, pid => Pid}),
            _ = inets:stop(httpd, Pid)
        end,
        [Pid || {httpd, Pid, Info} <- inets:services_info(), is_list(Info), proplists:get_value(server_name, Info) =:= ?SERVER_NAME]
    ).

family(Ip) when tuple_size(Ip) =:= 8 -> inet6;
family(_) -> inet.

-spec handle_call(term(), gen_server:from(), #st{}) -> {reply, term(), #st{}}.
handle_call(port, _From, St) ->
    {reply, St#st.port, St};
handle_call(history, _From, St) ->
    {reply, maps:map(fun(_T, Samples) -> lists:reverse(Samples) end, St#st.history), St};
handle_call(Msg, _From, St) ->
    couch_workers_server:unknown_call(?MODULE, Msg, St).

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(Msg, St) ->
    couch_workers_server:unknown_cast(?MODULE, Msg, St).

-spec handle_info(term(), #st{}) -> {noreply, #st{}} | {stop, term(), #st{}}.
handle_info(sample, St) ->
    erlang:send_after(?SAMPLE_MS, self(), sample),
    {noreply, sample(St)};
handle_info({'EXIT', Pid, Reason}, #st{httpd = Pid} = St) ->
    {stop, {httpd_exited, Reason}, St};
handle_info({'EXIT', _Pid, _Reason}, St) ->
    {noreply, St};
handle_info(Msg, St) ->
    couch_workers_server:unknown_info(?MODULE, Msg, St).

-spec terminate(term(), #st{}) -> ok.
terminate(_Reason, #st{httpd = Pid}) ->
    _ = inets:stop(httpd, Pid),
    ok.

sample(St) ->
    Now = erlang:system_time(millisecond),
    Types = maps:get(types, couch_workers_metrics:metrics()),
    History = maps:fold(
        fun(T, #{jobs_finished := F, jobs_added := A}, Acc) ->
            Old = maps:get(T, St#st.history, []),
            Acc#{T => lists:sublist([{Now, F, A} | Old], ?SAMPLES)}
        end,
        #{},
        Types
    ),
    St#st{history = History}.
