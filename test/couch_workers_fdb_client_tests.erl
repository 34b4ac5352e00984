%% @doc couch_workers_fdb_client: erlfdb owns the VM's FoundationDB client
%% when it is there (docs/fdb.md, "Sharing the client with erlfdb").
-module(couch_workers_fdb_client_tests).

-include_lib("eunit/include/eunit.hrl").

embedded_store_never_touches_erlfdb_test() ->
    ?assertEqual(ok, couch_workers_fdb_client:decide({embedded, <<"d">>}, absent)),
    ?assertEqual(ok, couch_workers_fdb_client:decide({embedded, <<"d">>}, {present, {ok, 620}})),
    ?assertEqual(ok, couch_workers_fdb_client:decide({embedded, <<"d">>}, {present, undefined})).

fdb_without_erlfdb_owns_the_client_test() ->
    ?assertEqual(ok, couch_workers_fdb_client:decide({fdb, <<"f">>}, absent)).

fdb_with_erlfdb_loads_it_first_test() ->
    ?assertEqual(load_erlfdb, couch_workers_fdb_client:decide({fdb, <<"f">>}, {present, {ok, 710}})),
    ?assertEqual(load_erlfdb, couch_workers_fdb_client:decide({fdb, <<"f">>}, {present, {ok, 730}})).

fdb_with_an_older_erlfdb_api_version_is_refused_test() ->
    ?assertMatch(
        {error, {erlfdb_api_version, 620, _}},
        couch_workers_fdb_client:decide({fdb, <<"f">>}, {present, {ok, 620}})
    ),
    %% erlfdb's default differs between forks (600, 620, 730): say it.
    ?assertMatch(
        {error, {erlfdb_api_version, erlfdb_default, _}},
        couch_workers_fdb_client:decide({fdb, <<"f">>}, {present, undefined})
    ).

%% This test VM has no erlfdb: preparing an FDB store loads nothing.
prepare_without_erlfdb_in_the_code_path_test() ->
    ?assertEqual(non_existing, code:which(erlfdb_nif)),
    ?assertEqual(ok, couch_workers_fdb_client:prepare({fdb, <<"/nonexistent/fdb.cluster">>})),
    ?assertEqual(ok, couch_workers_fdb_client:prepare({embedded, <<"dir">>})).

%% erlfdb is an optional dependency: listed so that it starts first when
%% the release has it, optional so that the app starts without it.
erlfdb_is_an_optional_application_test() ->
    _ = application:load(couch_workers),
    {ok, Apps} = application:get_key(couch_workers, applications),
    {ok, Optional} = application:get_key(couch_workers, optional_applications),
    ?assert(lists:member(erlfdb, Apps)),
    ?assertEqual([erlfdb], Optional).
