%% @doc A job type's settings, cluster-wide and stored (`couch_workers:
%% job_type_get/1', `job_type_set/2'): `activity_timeout' (seconds),
%% `max_running' and `max_running_per_group' (running jobs), each a
%% positive integer or `infinity' (the default of each).
-module(couch_workers_types).

-export([get/1, set/2]).

-export_type([settings/0]).

-type limit() :: pos_integer() | infinity.
-type settings() :: #{
    activity_timeout => limit(),
    max_running => limit(),
    max_running_per_group => limit()
}.

%% The store's integers are signed 64-bit.
-define(MAX_SETTING, 16#7fffffffffffffff).

%% @doc The type's settings, every key present (defaults filled in).
-spec get(binary()) -> settings() | {error, term()}.
get(Type) when is_binary(Type) ->
    case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_type_get(Ref, Type) end) of
        {ok, Settings} -> Settings;
        {error, _} = Error -> Error
    end;
get(_Type) ->
    erlang:error(badarg).

%% @doc Changes the settings `Settings' names; the others keep their
%% values. A key that is not a setting, or a value that is not a positive
%% integer or `infinity', is `{error, {bad_setting, Key}}' and nothing is
%% written.
-spec set(binary(), settings()) -> ok | {error, {bad_setting, term()} | term()}.
set(Type, Settings) when is_binary(Type), is_map(Settings) ->
    case bad_setting(maps:to_list(Settings)) of
        none ->
            case couch_workers_nif:call(fun(Ref) -> couch_workers_nif:job_type_set(Ref, Type, Settings) end) of
                {ok, _Stored} -> ok;
                {error, _} = Error -> Error
            end;
        Key ->
            {error, {bad_setting, Key}}
    end;
set(_Type, _Settings) ->
    erlang:error(badarg).

bad_setting([]) ->
    none;
bad_setting([{Key, Value} | Rest]) when
    Key =:= activity_timeout; Key =:= max_running; Key =:= max_running_per_group
->
    case Value =:= infinity orelse (is_integer(Value) andalso Value > 0 andalso Value =< ?MAX_SETTING) of
        true -> bad_setting(Rest);
        false -> Key
    end;
bad_setting([{Key, _} | _]) ->
    Key.
