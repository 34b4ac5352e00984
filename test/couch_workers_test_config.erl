%% @doc A stand-in for CouchDB's `config' application in the test suite
%% (CouchDB's cannot be installed here): a registered process that holds
%% ini settings and answers `get/3' as `config:get/3' does, with strings.
%% The app asks it instead of `config' when the app env `config_module'
%% names it.
-module(couch_workers_test_config).

-export([start/0, stop/0, get/3, set/3, load_ini/1]).

-spec start() -> ok.
start() ->
    Parent = self(),
    Pid = spawn(fun() ->
        register(?MODULE, self()),
        ?MODULE = ets:new(?MODULE, [named_table, public, {read_concurrency, true}]),
        Parent ! {?MODULE, started},
        receive
            stop -> ok
        end
    end),
    receive
        {?MODULE, started} -> ok
    after 5000 -> erlang:error({not_started, Pid})
    end.

-spec stop() -> ok.
stop() ->
    case whereis(?MODULE) of
        undefined ->
            ok;
        Pid ->
            MRef = erlang:monitor(process, Pid),
            Pid ! stop,
            receive
                {'DOWN', MRef, process, Pid, _} -> ok
            end
    end.

-spec get(string(), string(), term()) -> term().
get(Section, Key, Default) ->
    case ets:lookup(?MODULE, {Section, Key}) of
        [{_, Value}] -> Value;
        [] -> Default
    end.

-spec set(string(), string(), string()) -> ok.
set(Section, Key, Value) ->
    true = ets:insert(?MODULE, {{Section, Key}, Value}),
    ok.

%% @doc Loads an ini file as CouchDB's config reads one: `[section]'
%% headers, `key = value' lines, `;' comments. Returns what it set.
-spec load_ini(file:filename()) -> [{{string(), string()}, string()}].
load_ini(File) ->
    {ok, Text} = file:read_file(File),
    Lines = string:split(unicode:characters_to_list(Text), "\n", all),
    {_, Set} = lists:foldl(fun ini_line/2, {undefined, []}, Lines),
    [ok = set(S, K, V) || {{S, K}, V} <- Set],
    lists:reverse(Set).

ini_line(Line0, {Section, Acc}) ->
    Line = string:trim(Line0),
    case Line of
        "" -> {Section, Acc};
        ";" ++ _ -> {Section, Acc};
        "[" ++ Rest -> {string:trim(Rest, trailing, "]"), Acc};
        _ ->
            [Key, Value] = string:split(Line, "="),
            {Section, [{{Section, string:trim(Key)}, string:trim(Value)} | Acc]}
    end.
