%% @doc Job type settings: `job_type_get/1' with defaults, `job_type_set/2'
%% changing only the keys it names, a change seen by every node's call at
%% once (the store is the one copy), and bad input: badarg for wrong
%% shapes, `{error, {bad_setting, Key}}' for a bad key or value, nothing
%% written either way.
-module(couch_workers_types_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

types_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job type settings", fun setup/0, fun teardown/1, [
        ?TDEF_FE(defaults_when_never_set),
        ?TDEF_FE(set_changes_only_the_named_keys),
        ?TDEF_FE(types_are_apart),
        ?TDEF_FE(bad_input_writes_nothing)
    ]).

setup() ->
    #{type => unique_type("types")}.

teardown(_) ->
    ok.

defaults() ->
    #{activity_timeout => infinity, max_running => infinity, max_running_per_group => infinity}.

%% ---- tests ---------------------------------------------------------------

defaults_when_never_set(#{type := T}) ->
    ?assertEqual(defaults(), couch_workers:job_type_get(T)).

set_changes_only_the_named_keys(#{type := T}) ->
    ok = couch_workers:job_type_set(T, #{max_running => 8, activity_timeout => 30}),
    ?assertEqual((defaults())#{max_running := 8, activity_timeout := 30}, couch_workers:job_type_get(T)),
    ok = couch_workers:job_type_set(T, #{max_running => infinity, max_running_per_group => 2}),
    ?assertEqual((defaults())#{activity_timeout := 30, max_running_per_group := 2}, couch_workers:job_type_get(T)),
    %% An empty change writes nothing and answers ok.
    ok = couch_workers:job_type_set(T, #{}),
    ?assertEqual((defaults())#{activity_timeout := 30, max_running_per_group := 2}, couch_workers:job_type_get(T)).

types_are_apart(#{type := T}) ->
    Other = <<T/binary, 0>>,
    ok = couch_workers:job_type_set(T, #{max_running => 3}),
    ?assertEqual(defaults(), couch_workers:job_type_get(Other)),
    ?assertEqual((defaults())#{max_running := 3}, couch_workers:job_type_get(T)).

bad_input_writes_nothing(#{type := T}) ->
    ok = couch_workers:job_type_set(T, #{max_running => 5}),
    Stored = couch_workers:job_type_get(T),
    ?assertEqual({error, {bad_setting, max_running}}, couch_workers:job_type_set(T, #{max_running => 0})),
    ?assertEqual({error, {bad_setting, max_running}}, couch_workers:job_type_set(T, #{max_running => -1})),
    ?assertEqual(
        {error, {bad_setting, activity_timeout}},
        couch_workers:job_type_set(T, #{max_running => 9, activity_timeout => <<"30">>})
    ),
    ?assertEqual(
        {error, {bad_setting, max_running_per_group}},
        couch_workers:job_type_set(T, #{max_running_per_group => 1 bsl 63})
    ),
    ?assertEqual({error, {bad_setting, priority}}, couch_workers:job_type_set(T, #{priority => 1})),
    ?assertEqual({error, {bad_setting, <<"max_running">>}}, couch_workers:job_type_set(T, #{<<"max_running">> => 1})),
    ?assertError(badarg, couch_workers:job_type_set(T, [{max_running, 1}])),
    ?assertError(badarg, couch_workers:job_type_set("t", #{max_running => 1})),
    ?assertError(badarg, couch_workers:job_type_get("t")),
    ?assertEqual(Stored, couch_workers:job_type_get(T)),
    %% The NIF refuses what the wrapper lets through only by shape.
    ?assertError(badarg, couch_workers_nif:job_type_set(make_ref(), T, #{max_running => -1})),
    ?assertError(badarg, couch_workers_nif:job_type_set(make_ref(), T, #{other => 1})),
    ?assertEqual({error, bad_max_running}, couch_workers_nif:call(fun(Ref) ->
        couch_workers_nif:job_type_set(Ref, T, #{max_running => 0})
    end)),
    ?assertEqual({error, key_too_large}, couch_workers:job_type_set(binary:copy(<<"t">>, 10001), #{max_running => 1})),
    ?assertEqual({error, key_too_large}, couch_workers:job_type_get(binary:copy(<<"t">>, 10001))),
    ?assertEqual(Stored, couch_workers:job_type_get(T)).
