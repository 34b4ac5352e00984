%% @doc The settings of couch_workers: the application env, overridden
%% by the `[couch_workers]' section of CouchDB's ini files when CouchDB's
%% `config' application runs in this VM.
%%
%% CouchDB operators configure everything through ini files, which its
%% `config' application serves as strings (`config:get/3'). Outside
%% CouchDB there is no such process and the app env alone decides, so
%% couch_workers neither depends on `config' nor requires it: it asks it
%% only when its process is registered. Ini values are strings; each key
%% has one type, and a string that does not parse as that type is an
%% error naming the key, never silently replaced by a default.
%%
%% Settings are read when the application starts; a changed ini value
%% takes effect at the next start.
-module(couch_workers_config).

-export([get/1, keys/0, parse/2, ini_section/0]).

-include_lib("kernel/include/logger.hrl").

-define(SECTION, "couch_workers").

-type key() ::
    store
    | runtime_threads
    | reaper_max_interval_ms
    | tx_timeout_ms
    | embedded_safety_look_ms
    | job_keep_s
    | retry_backoff_base_ms
    | retry_backoff_max_ms.
-type kind() :: store | pos_integer | keep.
-export_type([key/0]).

%% @doc Every documented key with its type and default.
-spec keys() -> [{key(), kind(), term()}].
keys() ->
    [
        {store, store, {embedded, "couch_workers_data"}},
        {runtime_threads, pos_integer, 2},
        {reaper_max_interval_ms, pos_integer, 500},
        {tx_timeout_ms, pos_integer, 5000},
        {embedded_safety_look_ms, pos_integer, 10000},
        %% Read at each call that uses them (job_add, job_fail), not only
        %% at start.
        {job_keep_s, keep, infinity},
        {retry_backoff_base_ms, pos_integer, 1000},
        {retry_backoff_max_ms, pos_integer, 3600000}
    ].

%% @doc The ini section couch_workers reads.
-spec ini_section() -> string().
ini_section() ->
    ?SECTION.

%% @doc The value of `Key': the ini's when CouchDB's `config' runs and
%% sets it, else the app env's, else the default. `{error, {badconfig,
%% ...}}' when the ini's string is not of the key's type.
-spec get(key()) -> {ok, term()} | {error, {badconfig, {key(), string()}}}.
get(Key) ->
    {Key, Kind, Default} = lists:keyfind(Key, 1, keys()),
    case ini_value(Key) of
        undefined ->
            {ok, application:get_env(couch_workers, Key, Default)};
        String ->
            case parse(Kind, String) of
                {ok, Value} ->
                    {ok, Value};
                error ->
                    ?LOG_ERROR(#{
                        what => config_value_invalid,
                        section => ?SECTION,
                        key => Key,
                        value => String
                    }),
                    {error, {badconfig, {Key, String}}}
            end
    end.

%% @doc An ini string as a value of a key's type. `store' is
%% `embedded:Dir' or `fdb:ClusterFile' (a bare `embedded' is the default
%% directory); integers are decimal.
-spec parse(kind(), string()) -> {ok, term()} | error.
parse(store, String) ->
    case string:split(string:trim(String), ":") of
        ["embedded"] -> {ok, {embedded, "couch_workers_data"}};
        ["embedded", Dir] when Dir =/= "" -> {ok, {embedded, Dir}};
        ["fdb", File] when File =/= "" -> {ok, {fdb, File}};
        _ -> error
    end;
parse(keep, String) ->
    case string:trim(String) of
        "infinity" ->
            {ok, infinity};
        Trimmed ->
            try list_to_integer(Trimmed) of
                N when N >= 0 -> {ok, N};
                _ -> error
            catch
                error:badarg -> error
            end
    end;
parse(pos_integer, String) ->
    try list_to_integer(string:trim(String)) of
        N when N > 0 -> {ok, N};
        _ -> error
    catch
        error:badarg -> error
    end.

%% CouchDB's `config' registers its server under its module's name; the
%% module can be replaced (app env `config_module') so that the test
%% suite can stand in for CouchDB's, which is not installable here.
ini_value(Key) ->
    Module = application:get_env(couch_workers, config_module, config),
    case is_pid(whereis(Module)) andalso erlang:function_exported(Module, get, 3) of
        true ->
            case Module:get(?SECTION, atom_to_list(Key), undefined) of
                Value when is_list(Value) -> Value;
                Value when is_binary(Value) -> binary_to_list(Value);
                _ -> undefined
            end;
        false ->
            undefined
    end.
