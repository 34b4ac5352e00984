%% @doc Recurring jobs through the Erlang API: a schedule creates one
%% job per due slot with the slot's id, `schedules/1' lists it with its
%% next run and last run, `schedule_remove/2' stops it, bad specs say why,
%% and `if_leader' fences `schedule_set/5'.
-module(couch_workers_schedules_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

schedules_test_() ->
    couch_workers_test_util:app_fixture("couch_workers: recurring jobs", fun setup/0, fun teardown/1, [
        ?TDEF_FE(bad_specs_say_why),
        ?TDEF_FE(every_second_creates_a_job_per_slot, 30),
        ?TDEF_FE(schedules_lists_and_remove_stops, 30),
        ?TDEF_FE(cron_and_options_are_listed_as_given),
        ?TDEF_FE(slot_jobs_get_group_and_activity_timeout, 30),
        ?TDEF_FE(if_leader_fences_schedule_set)
    ]).

setup() ->
    #{type => unique_type("sc")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

bad_specs_say_why(#{type := T}) ->
    [
        ?assertMatch({error, {bad_schedule, Why}} when is_binary(Why), couch_workers:schedule_set(T, <<"s">>, Spec, #{}, #{}))
     || Spec <- [
            #{every => 999},
            #{every => 1000, cron => <<"* * * * *">>},
            #{cron => <<"99 * * * *">>},
            #{cron => <<"* * * *">>},
            #{every => 1000, color => red},
            #{every => 1000, catch_up => sometimes},
            #{every => 1000, overlap => maybe},
            #{every => 1000, start_at => -5},
            #{}
        ]
    ],
    ?assertEqual({error, {bad_schedule, <<"unknown key color">>}}, couch_workers:schedule_set(T, <<"s">>, #{every => 1000, color => red}, #{}, #{})),
    ?assertEqual([], couch_workers:schedules(T)),
    ?assertError(badarg, couch_workers:schedule_set(T, <<"s">>, not_a_map, #{}, #{})),
    ?assertEqual({error, invalid_priority}, couch_workers:schedule_set(T, <<"s">>, #{every => 1000}, #{}, #{priority => x})).

every_second_creates_a_job_per_slot(#{type := T}) ->
    ok = couch_workers:schedule_set(T, <<"tick">>, #{every => 1000, overlap => true}, #{<<"db">> => <<"a">>}, #{priority => 3}),
    ok = wait_for(fun() -> length(slot_jobs(T, <<"tick">>)) >= 3 end, 10000),
    ok = couch_workers:schedule_remove(T, <<"tick">>),
    Slots = [S || {S, _} <- slot_jobs(T, <<"tick">>)],
    First = hd(Slots),
    ?assertEqual(lists:seq(First, lists:last(Slots), 1000), Slots),
    ?assertEqual(0, First rem 1000),
    [{_, Id} | _] = slot_jobs(T, <<"tick">>),
    ?assertMatch({ok, #{info := #{<<"db">> := <<"a">>}, priority := 3}}, couch_workers:job_get(T, Id)).

schedules_lists_and_remove_stops(#{type := T}) ->
    ok = couch_workers:schedule_set(T, <<"s">>, #{every => 1000}, #{}, #{}),
    ok = wait_for(fun() -> slot_jobs(T, <<"s">>) =/= [] end, 10000),
    [#{id := <<"s">>, spec := Spec, next_run_at := Next, last_run := Last}] = couch_workers:schedules(T),
    ?assertEqual(#{every => 1000, overlap => false, catch_up => latest}, Spec),
    ?assert(is_integer(Next) andalso Next rem 1000 =:= 0),
    ?assert(lists:member(Last, [Id || {_, Id} <- slot_jobs(T, <<"s">>)])),
    ok = couch_workers:schedule_remove(T, <<"s">>),
    ?assertEqual({error, not_found}, couch_workers:schedule_remove(T, <<"s">>)),
    ?assertEqual([], couch_workers:schedules(T)),
    Before = slot_jobs(T, <<"s">>),
    ?assertNotEqual([], Before, "runs already created stay"),
    timer:sleep(1500),
    ?assertEqual(Before, slot_jobs(T, <<"s">>), "no run after the removal").

cron_and_options_are_listed_as_given(#{type := T}) ->
    ok = couch_workers:schedule_set(
        T, <<"nightly">>, #{cron => <<"30 2 * * *">>, catch_up => all, overlap => true, start_at => 0}, #{}, #{
            max_attempts => 3, keep => 60
        }
    ),
    [#{spec := Spec, opts := Opts, next_run_at := Next, last_run := null}] = couch_workers:schedules(T),
    ?assertEqual(#{cron => <<"30 2 * * *">>, catch_up => all, overlap => true, start_at => 0}, Spec),
    ?assertEqual(#{max_attempts => 3, keep => 60}, Opts),
    ?assertEqual((2 * 60 + 30) * 60000, Next rem 86400000),
    ok = couch_workers:schedule_remove(T, <<"nightly">>).

slot_jobs_get_group_and_activity_timeout(#{type := T}) ->
    ok = couch_workers:schedule_set(T, <<"g">>, #{every => 1000}, #{}, #{group => <<"db">>, activity_timeout => 26}),
    ?assertMatch([#{opts := #{group := <<"db">>, activity_timeout := 26}}], couch_workers:schedules(T)),
    ok = wait_for(fun() -> slot_jobs(T, <<"g">>) =/= [] end, 10000),
    [{_, Id} | _] = slot_jobs(T, <<"g">>),
    ?assertMatch({ok, #{group := <<"db">>, activity_timeout := 26}}, couch_workers:job_get(T, Id)),
    ok = couch_workers:schedule_remove(T, <<"g">>).

if_leader_fences_schedule_set(#{type := T}) ->
    WT = <<T/binary, "-workers">>,
    W = couch_workers:worker_register(WT, <<"w1">>, #{}, self()),
    {ok, <<"w1">>, Epoch} = couch_workers:leader(WT),
    ?assertEqual(ok, couch_workers:schedule_set(T, <<"a">>, #{every => 60000}, #{}, #{if_leader => {WT, Epoch}})),
    ok = couch_workers:worker_unregister(W),
    ?assertEqual({error, not_leader}, couch_workers:schedule_set(T, <<"b">>, #{every => 60000}, #{}, #{if_leader => {WT, Epoch}})),
    ?assertMatch([#{id := <<"a">>}], couch_workers:schedules(T)),
    ok = couch_workers:schedule_remove(T, <<"a">>).

%% ---- helpers ---------------------------------------------------------------

%% [{Slot, JobId}] of schedule `Id', by slot.
slot_jobs(T, Id) ->
    {ok, Jobs, _} = couch_workers:job_list(T, #{limit => 1000}),
    Prefix = <<Id/binary, "@">>,
    N = byte_size(Prefix),
    lists:sort([{binary_to_integer(Slot), JobId} || #{id := <<P:N/binary, Slot/binary>> = JobId} <- Jobs, P =:= Prefix]).
