%% @doc Which store the EUnit suites run on: FoundationDB when
%% FDB_CLUSTER_FILE is set, each app start under its own test directory; the
%% embedded store otherwise, with one loud line saying the FoundationDB run
%% is skipped.
-module(couch_workers_test_store_tests).

-include_lib("eunit/include/eunit.hrl").

selection_follows_fdb_cluster_file_test() ->
    ?assertEqual({embedded, "/tmp/d"}, couch_workers_test_util:test_store(false, "/tmp/d", "n")),
    ?assertEqual({embedded, "/tmp/d"}, couch_workers_test_util:test_store("", "/tmp/d", "n")),
    ?assertEqual(
        {fdb_test, "/etc/foundationdb/fdb.cluster", "cw_eunit_1_2"},
        couch_workers_test_util:test_store("/etc/foundationdb/fdb.cluster", "/tmp/d", "cw_eunit_1_2")
    ).

skip_line_prints_without_fdb_test() ->
    Out = capture(fun(Io) -> couch_workers_test_util:fdb_notice(false, Io) end),
    ?assertNotEqual(nomatch, string:find(Out, "FDB_CLUSTER_FILE is not set")),
    ?assertNotEqual(nomatch, string:find(Out, "SKIPPED")),
    Run = capture(fun(Io) -> couch_workers_test_util:fdb_notice("/etc/fdb.cluster", Io) end),
    ?assertEqual(nomatch, string:find(Run, "SKIPPED")),
    ?assertNotEqual(nomatch, string:find(Run, "/etc/fdb.cluster")).

fdb_test_store_loads_erlfdb_like_fdb_test() ->
    ?assertEqual(ok, couch_workers_fdb_client:decide({fdb_test, <<"f">>, <<"n">>}, absent)),
    ?assertEqual(load_erlfdb, couch_workers_fdb_client:decide({fdb_test, <<"f">>, <<"n">>}, {present, {ok, 710}})).

%% The setting reaches the store: on a NIF built without the `fdb'
%% feature it is decoded (not `badconfig') and refused as not built.
fdb_test_setting_is_decoded_by_the_nif_test_() ->
    case os:getenv("FDB_CLUSTER_FILE") of
        F when F =:= false; F =:= "" ->
            {timeout, 60, fun fdb_test_setting_without_fdb/0};
        _ ->
            []
    end.

fdb_test_setting_without_fdb() ->
    _ = application:stop(couch_workers),
    _ = application:load(couch_workers),
    Old = application:get_env(couch_workers, store),
    ok = application:set_env(couch_workers, store, {fdb_test, "/nonexistent/fdb.cluster", "cw_eunit_decode"}),
    try
        Result = application:start(couch_workers),
        ?assertMatch({error, {{node_start_failed, _}, _}}, Result),
        {error, {{node_start_failed, Reason}, _}} = Result,
        ?assertNotEqual({badconfig, store}, Reason),
        ?assertNotEqual(nomatch, string:find(lists:flatten(io_lib:format("~p", [Reason])), "fdb_not_built"))
    after
        case Old of
            {ok, V} -> application:set_env(couch_workers, store, V);
            undefined -> application:unset_env(couch_workers, store)
        end
    end.

%% ---- helpers --------------------------------------------------------------

%% What Fun writes to the io device it is given.
capture(Fun) ->
    Io = spawn_link(fun() -> io_collect([]) end),
    ok = Fun(Io),
    Io ! {get, self()},
    receive
        {text, Text} -> Text
    after 5000 -> error(no_output)
    end.

io_collect(Acc) ->
    receive
        {io_request, From, ReplyAs, Request} ->
            From ! {io_reply, ReplyAs, ok},
            io_collect([chars(Request) | Acc]);
        {get, Pid} ->
            Pid ! {text, unicode:characters_to_list(lists:reverse(Acc))}
    end.

chars({put_chars, unicode, M, F, A}) -> apply(M, F, A);
chars({put_chars, unicode, Chars}) -> Chars;
chars({put_chars, latin1, Chars}) -> Chars;
chars(_) -> [].
