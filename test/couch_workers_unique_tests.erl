%% @doc Unique keys through the Erlang API: the option `unique' of
%% `job_add/4', `job_add_many/2' (all or nothing) and `job_resubmit/4';
%% `{error, {duplicate, HolderId}}' writes nothing; the key is free again
%% when the holder ends; the Job map's `unique'; bad keys.
-module(couch_workers_unique_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2]).

unique_test_() ->
    couch_workers_test_util:app_fixture("couch_workers unique keys", fun setup/0, fun teardown/1, [
        ?TDEF_FE(duplicate_names_the_holder_and_writes_nothing),
        ?TDEF_FE(add_many_is_all_or_nothing),
        ?TDEF_FE(free_again_when_the_holder_ends),
        ?TDEF_FE(resubmit_keeps_or_moves_the_key),
        ?TDEF_FE(bad_keys)
    ]).

setup() ->
    T = unique_type("uniq"),
    #{type => T, worker => register_worker(T, <<"w">>)}.

teardown(#{worker := W}) ->
    ok = couch_workers:worker_unregister(W).

%% ---- tests ---------------------------------------------------------------

duplicate_names_the_holder_and_writes_nothing(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{unique => <<"db1">>}),
    ?assertMatch({ok, #{unique := <<"db1">>}}, couch_workers:job_get(T, <<"a">>)),
    ?assertEqual({error, {duplicate, <<"a">>}}, couch_workers:job_add(T, <<"b">>, #{}, #{unique => <<"db1">>})),
    ?assertEqual({error, {duplicate, <<"a">>}}, couch_workers:job_add(T, <<"b">>, #{}, #{<<"unique">> => <<"db1">>})),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"b">>)),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{}),
    ?assertMatch({ok, #{unique := null}}, couch_workers:job_get(T, <<"c">>)).

add_many_is_all_or_nothing(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{unique => <<"k1">>}),
    ?assertEqual(
        {error, {duplicate, <<"a">>}},
        couch_workers:job_add_many(T, [{<<"x">>, #{}, #{unique => <<"k0">>}}, {<<"y">>, #{}, #{unique => <<"k1">>}}])
    ),
    ?assertEqual(
        {error, {duplicate, <<"x">>}},
        couch_workers:job_add_many(T, [{<<"x">>, #{}, #{unique => <<"k2">>}}, {<<"y">>, #{}, #{unique => <<"k2">>}}])
    ),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    ok = couch_workers:job_add_many(T, [{<<"x">>, #{}, #{unique => <<"k2">>}}, {<<"y">>, #{}, #{}}]),
    ?assertEqual({error, {duplicate, <<"x">>}}, couch_workers:job_add(T, <<"z">>, #{}, #{unique => <<"k2">>})).

free_again_when_the_holder_ends(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{unique => <<"k">>}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, {duplicate, <<"a">>}}, couch_workers:job_add(T, <<"b">>, #{}, #{unique => <<"k">>})),
    ok = couch_workers:job_finish(J, #{}),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{unique => <<"k">>}),
    ok = couch_workers:job_cancel(T, <<"b">>),
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{unique => <<"k">>}),
    ok = couch_workers:job_remove(T, <<"c">>),
    ok = couch_workers:job_add(T, <<"d">>, #{}, #{unique => <<"k">>}).

resubmit_keeps_or_moves_the_key(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{unique => <<"k1">>}),
    ok = couch_workers:job_resubmit(T, <<"a">>, #{<<"n">> => 1}, #{}),
    ?assertMatch({ok, #{unique := <<"k1">>}}, couch_workers:job_get(T, <<"a">>)),
    ok = couch_workers:job_resubmit(T, <<"a">>, #{}, #{unique => <<"k2">>}),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{unique => <<"k1">>}),
    ?assertEqual({error, {duplicate, <<"b">>}}, couch_workers:job_resubmit(T, <<"a">>, #{}, #{unique => <<"k1">>})),
    ?assertEqual({error, {duplicate, <<"a">>}}, couch_workers:job_resubmit(T, <<"new">>, #{}, #{unique => <<"k2">>})),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"new">>)).

bad_keys(#{type := T}) ->
    ?assertEqual({error, invalid_unique}, couch_workers:job_add(T, <<"a">>, #{}, #{unique => k})),
    ?assertEqual({error, invalid_unique}, couch_workers:job_add_many(T, [{<<"a">>, #{}, #{unique => 1}}])),
    ?assertEqual({error, invalid_unique}, couch_workers:job_resubmit(T, <<"a">>, #{}, #{unique => "k"})),
    ?assertEqual(
        {error, key_too_large}, couch_workers:job_add(T, <<"a">>, #{}, #{unique => binary:copy(<<"k">>, 10001)})
    ),
    %% The NIF takes a binary or `undefined' as the options' fifth element.
    ?assertError(badarg, couch_workers_nif:job_add(make_ref(), T, <<"a">>, #{}, {0, undefined, undefined, undefined, k})),
    ?assertEqual(0, couch_workers:job_pending_count(T)).
