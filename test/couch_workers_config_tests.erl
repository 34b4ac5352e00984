%% @doc Settings: the app env, CouchDB's ini section through its `config'
%% application (here the stand-in `couch_workers_test_config'), the
%% examples in erlang/, and a clear error when the NIF is not built.
-module(couch_workers_config_tests).

-include_lib("eunit/include/eunit.hrl").

-define(STANDIN, couch_workers_test_config).

%% erlang/ of this checkout, found from this module's own source.
examples_dir() ->
    Source = proplists:get_value(source, ?MODULE:module_info(compile)),
    filename:join([filename:dirname(filename:dirname(Source)), "erlang"]).

config_test_() ->
    {foreach,
        fun() ->
            _ = application:stop(couch_workers),
            ok = case application:load(couch_workers) of
                ok -> ok;
                {error, {already_loaded, couch_workers}} -> ok
            end,
            logger:set_primary_config(level, warning),
            Saved = application:get_all_env(couch_workers),
            ok = ?STANDIN:start(),
            Saved
        end,
        fun(Saved) ->
            _ = application:stop(couch_workers),
            ok = ?STANDIN:stop(),
            [application:unset_env(couch_workers, K) || {K, _} <- application:get_all_env(couch_workers)],
            [application:set_env(couch_workers, K, V) || {K, V} <- Saved],
            ok
        end,
        [
            fun without_config_the_app_env_decides/0,
            fun the_ini_section_overrides_the_app_env/0,
            fun the_ini_example_holds_every_key_with_its_type/0,
            fun the_app_starts_on_the_store_the_ini_names/0,
            fun a_bad_ini_value_names_its_key/0,
            fun the_node_config_carries_every_node_key/0,
            fun the_sys_config_example_holds_every_key/0
        ]}.

%% config_module names the stand-in, but no process of that name runs:
%% as outside CouchDB, the app env (else the default) decides.
without_config_the_app_env_decides() ->
    ok = ?STANDIN:stop(),
    ok = application:set_env(couch_workers, config_module, ?STANDIN),
    ok = application:set_env(couch_workers, tx_timeout_ms, 1234),
    ok = application:unset_env(couch_workers, reaper_max_interval_ms),
    ?assertEqual({ok, 1234}, couch_workers_config:get(tx_timeout_ms)),
    ?assertEqual({ok, 500}, couch_workers_config:get(reaper_max_interval_ms)).

the_ini_section_overrides_the_app_env() ->
    ok = application:set_env(couch_workers, config_module, ?STANDIN),
    ok = application:set_env(couch_workers, tx_timeout_ms, 1234),
    ok = application:set_env(couch_workers, runtime_threads, 3),
    ok = ?STANDIN:set("couch_workers", "tx_timeout_ms", "4321"),
    ?assertEqual({ok, 4321}, couch_workers_config:get(tx_timeout_ms)),
    %% A key the ini does not set keeps the app env's value.
    ?assertEqual({ok, 3}, couch_workers_config:get(runtime_threads)),
    %% Another section is not read.
    ok = ?STANDIN:set("couchdb", "runtime_threads", "7"),
    ?assertEqual({ok, 3}, couch_workers_config:get(runtime_threads)).

%% The README's ini example is erlang/couch_workers.ini: every key it sets
%% is documented and parses as its type; together they are every key.
the_ini_example_holds_every_key_with_its_type() ->
    ok = application:set_env(couch_workers, config_module, ?STANDIN),
    Set = ?STANDIN:load_ini(filename:join(examples_dir(), "couch_workers.ini")),
    Keys = [K || {K, _, _} <- couch_workers_config:keys()],
    IniKeys = lists:sort([list_to_atom(K) || {{"couch_workers", K}, _} <- Set]),
    ?assertEqual(lists:sort(Keys), IniKeys),
    ?assertEqual({ok, {embedded, "./data/couch_workers"}}, couch_workers_config:get(store)),
    ?assertEqual({ok, 2}, couch_workers_config:get(runtime_threads)),
    ?assertEqual({ok, 500}, couch_workers_config:get(reaper_max_interval_ms)),
    ?assertEqual({ok, 5000}, couch_workers_config:get(tx_timeout_ms)),
    ?assertEqual({ok, 10000}, couch_workers_config:get(embedded_safety_look_ms)).

%% The ini's store wins over an app env store that could not even open.
the_app_starts_on_the_store_the_ini_names() ->
    Dir = couch_workers_test_util:tmp_dir(),
    ok = application:set_env(couch_workers, config_module, ?STANDIN),
    ok = application:set_env(couch_workers, store, {bogus, "/nowhere"}),
    ok = ?STANDIN:set("couch_workers", "store", "embedded:" ++ Dir),
    try
        {ok, _} = application:ensure_all_started(couch_workers),
        Type = couch_workers_test_util:unique_type(<<"ini">>),
        Ref = couch_workers:worker_register(Type, <<"w1">>, #{}, self()),
        ?assert(is_reference(Ref)),
        {ok, Files} = file:list_dir(Dir),
        ?assertNotEqual([], Files),
        ok = couch_workers:worker_unregister(Ref)
    after
        _ = application:stop(couch_workers),
        _ = file:del_dir_r(Dir)
    end.

a_bad_ini_value_names_its_key() ->
    %% (The failed start logs errors on purpose.)
    logger:set_primary_config(level, none),
    ok = application:set_env(couch_workers, config_module, ?STANDIN),
    ok = ?STANDIN:set("couch_workers", "tx_timeout_ms", "five seconds"),
    ?assertEqual(
        {error, {badconfig, {tx_timeout_ms, "five seconds"}}},
        couch_workers_config:get(tx_timeout_ms)
    ),
    ?assertMatch(
        {error, {{node_start_failed, {badconfig, {tx_timeout_ms, "five seconds"}}}, _}},
        application:start(couch_workers)
    ),
    ok = ?STANDIN:set("couch_workers", "tx_timeout_ms", "5000"),
    ok = ?STANDIN:set("couch_workers", "store", "sqlite:/tmp/x"),
    ?assertEqual({error, {badconfig, {store, "sqlite:/tmp/x"}}}, couch_workers_config:get(store)),
    ?assertEqual(error, couch_workers_config:parse(pos_integer, "0")),
    ?assertEqual(error, couch_workers_config:parse(pos_integer, "-3")),
    ?assertEqual({ok, {fdb, "/etc/foundationdb/fdb.cluster"}},
                 couch_workers_config:parse(store, "fdb:/etc/foundationdb/fdb.cluster")),
    ?assertEqual({ok, {embedded, "couch_workers_data"}}, couch_workers_config:parse(store, "embedded")).

%% What the NIF's start/2 is given: the settings it reads, the ini's
%% value over the app env's, and a valid safety look starts a node.
the_node_config_carries_every_node_key() ->
    Dir = couch_workers_test_util:tmp_dir(),
    ok = application:set_env(couch_workers, config_module, ?STANDIN),
    ok = application:set_env(couch_workers, store, {embedded, Dir}),
    ok = application:set_env(couch_workers, embedded_safety_look_ms, 2500),
    ?assertMatch(
        {ok, #{embedded_safety_look_ms := 2500, tx_timeout_ms := 5000, reaper_max_interval_ms := 500,
               runtime_threads := 2, store := _}},
        couch_workers_app:node_config()
    ),
    ok = ?STANDIN:set("couch_workers", "embedded_safety_look_ms", "86400000"),
    ?assertMatch({ok, #{embedded_safety_look_ms := 86400000}}, couch_workers_app:node_config()),
    try
        {ok, _} = application:ensure_all_started(couch_workers),
        ?assertMatch(#{running := true}, couch_workers:stats())
    after
        _ = application:stop(couch_workers),
        _ = file:del_dir_r(Dir)
    end.

%% erlang/sys.config (what `rebar3 shell' starts with, and the example
%% the README points to) sets documented keys only, to values the app takes.
the_sys_config_example_holds_every_key() ->
    {ok, [Terms]} = file:consult(filename:join(examples_dir(), "sys.config")),
    Env = proplists:get_value(couch_workers, Terms),
    Keys = [K || {K, _, _} <- couch_workers_config:keys()],
    ?assertEqual(lists:sort(Keys), lists:sort([K || {K, _} <- Env])),
    [?assertEqual(Default, proplists:get_value(K, Env)) || {K, _, Default} <- couch_workers_config:keys()].

%% A node whose code path has the app's modules but no priv/ (a release
%% or checkout whose NIF was never built) refuses to start the app with
%% a reason that says what is missing and how to build it.
missing_nif_test_() ->
    {timeout, 60, fun missing_nif_is_a_clear_start_error/0}.

missing_nif_is_a_clear_start_error() ->
    Root = couch_workers_test_util:tmp_dir(),
    Ebin = filename:join([Root, "couch_workers-0.1.0", "ebin"]),
    ok = filelib:ensure_dir(filename:join(Ebin, "x")),
    AppEbin = filename:dirname(code:which(couch_workers)),
    _ = application:load(couch_workers),
    {ok, Keys} = application:get_all_key(couch_workers),
    Modules = proplists:get_value(modules, Keys),
    [{ok, _} = file:copy(filename:join(AppEbin, atom_to_list(M) ++ ".beam"),
                         filename:join(Ebin, atom_to_list(M) ++ ".beam")) || M <- Modules],
    %% (Written from the loaded keys: rebar 2's eunit keeps no .app file
    %% next to the beams.)
    AppFile = io_lib:format("~p.~n", [{application, couch_workers, Keys}]),
    ok = file:write_file(filename:join(Ebin, "couch_workers.app"), AppFile),
    {ok, Peer, _} = peer:start(#{
        exec => os:find_executable("erl"),
        connection => standard_io,
        args => ["-pa", Ebin],
        wait_boot => 30000
    }),
    try
        ok = peer:call(Peer, logger, set_primary_config, [level, none]),
        Result = peer:call(Peer, application, start, [couch_workers], 30000),
        Lib = filename:join([Root, "couch_workers-0.1.0", "priv", "libcouch_workers_nif.so"]),
        ?assertMatch({error, {{nif_not_built, Lib, _Hint}, _}}, Result),
        {error, {{nif_not_built, _, Hint}, _}} = Result,
        ?assertNotEqual(nomatch, string:find(Hint, "cargo")),
        ?assertNotEqual(nomatch, string:find(Hint, "scripts/build-nif.sh"))
    after
        catch peer:stop(Peer),
        _ = file:del_dir_r(Root)
    end.
