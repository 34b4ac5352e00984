%% @doc The job options `group' and `activity_timeout' through the Erlang
%% API: shown in the Job map (`null' when not given), kept by writes that
%% do not name them, replaced by a resubmit that does (also one deferred
%% to the end of a run), in `job_add_many/2' too; bad values refused.
-module(couch_workers_job_opts_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2]).

job_opts_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job options group and activity_timeout", fun setup/0, fun teardown/1, [
        ?TDEF_FE(shown_in_the_job_map),
        ?TDEF_FE(kept_and_replaced_by_resubmit),
        ?TDEF_FE(a_deferred_resubmit_carries_them),
        ?TDEF_FE(bad_values)
    ]).

setup() ->
    T = unique_type("jopts"),
    #{type => T, worker => register_worker(T, <<"w">>)}.

teardown(#{worker := W}) ->
    ok = couch_workers:worker_unregister(W).

%% ---- tests ---------------------------------------------------------------

shown_in_the_job_map(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{group => <<"db1">>, activity_timeout => 30}),
    ?assertMatch({ok, #{group := <<"db1">>, activity_timeout := 30, unique := null}}, couch_workers:job_get(T, <<"a">>)),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{<<"activity_timeout">> => infinity, unique => <<"u">>}),
    ?assertMatch({ok, #{group := null, activity_timeout := infinity, unique := <<"u">>}}, couch_workers:job_get(T, <<"b">>)),
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{}),
    ?assertMatch({ok, #{group := null, activity_timeout := null}}, couch_workers:job_get(T, <<"c">>)),
    ok = couch_workers:job_add_many(T, [{<<"d">>, #{}, #{group => <<"g">>}}, {<<"e">>, #{}, #{}}]),
    ?assertMatch({ok, #{group := <<"g">>}}, couch_workers:job_get(T, <<"d">>)),
    ?assertMatch({ok, #{group := null}}, couch_workers:job_get(T, <<"e">>)).

kept_and_replaced_by_resubmit(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{group => <<"g1">>, activity_timeout => 5}),
    ok = couch_workers:job_resubmit(T, <<"a">>, #{<<"n">> => 1}, #{priority => 3}),
    ?assertMatch(
        {ok, #{group := <<"g1">>, activity_timeout := 5, priority := 3}}, couch_workers:job_get(T, <<"a">>)
    ),
    ok = couch_workers:job_resubmit(T, <<"a">>, #{}, #{group => <<"g2">>, activity_timeout => infinity}),
    ?assertMatch({ok, #{group := <<"g2">>, activity_timeout := infinity}}, couch_workers:job_get(T, <<"a">>)).

a_deferred_resubmit_carries_them(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{group => <<"g1">>}),
    {ok, Job} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch(#{id := <<"a">>, group := <<"g1">>, activity_timeout := null}, Job),
    %% Resubmitted while it runs: applied when the run ends.
    ok = couch_workers:job_resubmit(T, <<"a">>, #{}, #{group => <<"g2">>, activity_timeout => 7}),
    ?assertMatch({ok, #{state := running, group := <<"g1">>}}, couch_workers:job_get(T, <<"a">>)),
    ok = couch_workers:job_finish(Job, #{}),
    ?assertMatch(
        {ok, #{state := pending, group := <<"g2">>, activity_timeout := 7}}, couch_workers:job_get(T, <<"a">>)
    ).

bad_values(#{type := T}) ->
    ?assertEqual({error, invalid_group}, couch_workers:job_add(T, <<"a">>, #{}, #{group => g})),
    ?assertEqual({error, invalid_group}, couch_workers:job_add_many(T, [{<<"a">>, #{}, #{group => 1}}])),
    ?assertEqual({error, invalid_group}, couch_workers:job_resubmit(T, <<"a">>, #{}, #{group => "g"})),
    ?assertEqual({error, invalid_activity_timeout}, couch_workers:job_add(T, <<"a">>, #{}, #{activity_timeout => 0})),
    ?assertEqual({error, invalid_activity_timeout}, couch_workers:job_add(T, <<"a">>, #{}, #{activity_timeout => -1})),
    ?assertEqual({error, invalid_activity_timeout}, couch_workers:job_add(T, <<"a">>, #{}, #{activity_timeout => 1.5})),
    ?assertEqual(
        {error, invalid_activity_timeout}, couch_workers:job_resubmit(T, <<"a">>, #{}, #{activity_timeout => never})
    ),
    %% The NIF takes a binary or `undefined' as `Group', a positive
    %% integer, `infinity' or `undefined' as `ActivityTimeout'.
    Opts = fun(G, A) -> {0, undefined, undefined, undefined, undefined, G, A} end,
    ?assertError(badarg, couch_workers_nif:job_add(make_ref(), T, <<"a">>, #{}, Opts(g, undefined))),
    ?assertError(badarg, couch_workers_nif:job_add(make_ref(), T, <<"a">>, #{}, Opts(undefined, 0))),
    ?assertError(badarg, couch_workers_nif:job_add(make_ref(), T, <<"a">>, #{}, {0, undefined, undefined, undefined, undefined, undefined})),
    ?assertEqual(0, couch_workers:job_pending_count(T)).
