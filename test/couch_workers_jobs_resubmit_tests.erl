%% @doc `job_resubmit/4' and `job_remove/3': couch_jobs'
%% add-on-existing, done right. At most one queued copy of a job id; a
%% running job runs again after its run ends, with the resubmitted info;
%% `if_vs' makes read-check-write sequences atomic; subscribers see the
%% state changes, never a spurious `removed'.
%%
%% couch_jobs' tests of add-on-existing and resubmit, ported (same names;
%% couch_jobs' `add' of an existing job is `job_resubmit/4' here, its
%% scheduled time is `run_at'): resubmit_enqueues_job,
%% resubmit_finished_updates_job_data,
%% resubmit_running_does_not_update_job_data, resubmit_custom_schedtime,
%% add_pending_updates_job_data, add_finished_updates_job_data,
%% add_running_does_not_update_job_data, resubmit_as_job_creator.
%% `enqueue_inactive' (a job whose worker stopped is queued again) is
%% `couch_workers_jobs_multinode_tests:kill_9_of_peer_sends_its_jobs_back_to_pending'.
-module(couch_workers_jobs_resubmit_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2, wait_job/3, no_job_msg/2, job_state/2]).

resubmit_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job_resubmit/4 and job_remove/3", fun setup/0, fun teardown/1, [
        ?TDEF_FE(resubmit_enqueues_job),
        ?TDEF_FE(resubmit_finished_updates_job_data),
        ?TDEF_FE(resubmit_running_does_not_update_job_data),
        ?TDEF_FE(resubmit_custom_schedtime),
        ?TDEF_FE(add_pending_updates_job_data),
        ?TDEF_FE(add_finished_updates_job_data),
        ?TDEF_FE(add_running_does_not_update_job_data),
        ?TDEF_FE(resubmit_as_job_creator),
        ?TDEF_FE(resubmit_absent_adds),
        ?TDEF_FE(at_most_one_queued_copy),
        ?TDEF_FE(a_resubmitted_run_ends_queued_whatever_its_end),
        ?TDEF_FE(cancel_or_remove_wins_over_a_waiting_resubmission),
        ?TDEF_FE(a_resubmitted_schedule_survives_its_workers_exit, 30),
        ?TDEF_FE(subscribers_see_every_resubmit_never_removed),
        ?TDEF_FE(if_vs_acts_only_on_that_version),
        ?TDEF_FE(if_vs_races_from_many_processes, 30),
        ?TDEF_FE(bad_input_writes_nothing)
    ]).

setup() ->
    T = unique_type("resub"),
    #{type => T, worker => register_worker(T, <<"w">>)}.

teardown(#{worker := W}) ->
    ok = couch_workers:worker_unregister(W).

now_ms() ->
    os:system_time(millisecond).

get(T, Id) ->
    {ok, Job} = couch_workers:job_get(T, Id),
    Job.

%% ---- couch_jobs, ported -------------------------------------------------

resubmit_enqueues_job(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J1, #{}),
    ?assertMatch(#{state := finished}, get(T, <<"j">>)),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{}, #{}),
    ?assertMatch(#{state := pending, attempts := 0}, get(T, <<"j">>)),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    ?assertMatch(#{id := <<"j">>, attempts := 1}, J2),
    ok = couch_workers:job_finish(J2, #{}),
    ?assertMatch(#{state := finished}, get(T, <<"j">>)).

resubmit_finished_updates_job_data(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J1, #{<<"r">> => 1}),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{}),
    ?assertMatch(#{state := pending, info := #{<<"v">> := 2}, result := #{<<"r">> := 1}}, get(T, <<"j">>)),
    ?assertMatch({ok, #{info := #{<<"v">> := 2}}}, couch_workers:job_accept(W, #{})).

resubmit_running_does_not_update_job_data(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{}),
    %% The run goes on as its worker sees it.
    ?assertMatch(#{state := running, info := #{<<"v">> := 1}, worker := <<"w">>}, get(T, <<"j">>)),
    {ok, J2} = couch_workers:job_update(J1, #{<<"v">> => 1, <<"progress">> => 50}),
    ?assertMatch(#{state := running, info := #{<<"progress">> := 50}}, get(T, <<"j">>)),
    ok = couch_workers:job_finish(J2, #{<<"done">> => true}),
    %% Then it is queued again with the resubmitted info; the result stays.
    ?assertMatch(
        #{state := pending, info := #{<<"v">> := 2}, attempts := 0, error := null, result := #{<<"done">> := true}},
        get(T, <<"j">>)
    ),
    ?assertEqual(1, couch_workers:job_pending_count(T)).

resubmit_custom_schedtime(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J, #{}),
    At = now_ms() + 60000,
    ok = couch_workers:job_resubmit(T, <<"j">>, #{}, #{run_at => At}),
    ?assertMatch(#{state := scheduled, run_at := At}, get(T, <<"j">>)),
    %% Queued: another resubmit moves its schedule, earlier or later.
    ok = couch_workers:job_resubmit(T, <<"j">>, #{}, #{run_at => At + 1000}),
    ?assertMatch(#{state := scheduled, run_at := At2} when At2 =:= At + 1000, get(T, <<"j">>)),
    %% Options not given keep their values: still scheduled at At + 1000.
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"x">> => 1}, #{}),
    ?assertMatch(#{state := scheduled, run_at := At2, info := #{<<"x">> := 1}} when At2 =:= At + 1000, get(T, <<"j">>)),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{}, #{delay => 0}),
    ?assertMatch(#{state := pending, run_at := null}, get(T, <<"j">>)),
    ?assertMatch(#{scheduled := 0, pending := 1}, couch_workers:job_counts(T)).

add_pending_updates_job_data(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{}),
    ?assertMatch(#{state := pending, info := #{<<"v">> := 2}}, get(T, <<"j">>)),
    ?assertEqual(1, couch_workers:job_pending_count(T)).

add_finished_updates_job_data(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J, #{}),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{}),
    ?assertMatch(#{state := pending, info := #{<<"v">> := 2}}, get(T, <<"j">>)).

add_running_does_not_update_job_data(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    {ok, _J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{}),
    ?assertMatch(#{state := running, info := #{<<"v">> := 1}}, get(T, <<"j">>)).

%% couch_jobs' sequence: pending, resubmitted with a later time (it keeps
%% one copy, at the new time); running, flagged and re-queued at its
%% finish; finished, queued again.
resubmit_as_job_creator(#{type := T, worker := W}) ->
    Info = #{<<"x">> => 42},
    ok = couch_workers:job_add(T, <<"j">>, Info, #{run_at => 15}),
    ok = couch_workers:job_resubmit(T, <<"j">>, Info, #{run_at => 16}),
    ?assertMatch(#{state := pending}, get(T, <<"j">>)),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    Later = now_ms() + 600,
    ok = couch_workers:job_resubmit(T, <<"j">>, Info, #{run_at => Later}),
    ?assertMatch(#{state := running}, get(T, <<"j">>)),
    ok = couch_workers:job_finish(J1, #{}),
    ?assertMatch(#{state := scheduled, run_at := Later}, get(T, <<"j">>)),
    {ok, J2} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assert(now_ms() >= Later),
    ok = couch_workers:job_finish(J2, #{}),
    ?assertMatch(#{state := finished}, get(T, <<"j">>)),
    ok = couch_workers:job_resubmit(T, <<"j">>, Info, #{}),
    ?assertMatch(#{state := pending}, get(T, <<"j">>)).

%% ---- the rest of the contract ----------------------------------------------

resubmit_absent_adds(#{type := T}) ->
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"a">> => 1}, #{priority => 3, max_attempts => 5}),
    ?assertMatch(#{state := pending, priority := 3, max_attempts := 5, info := #{<<"a">> := 1}}, get(T, <<"j">>)),
    ok = couch_workers:job_resubmit(T, <<"s">>, #{}, #{delay => 60000}),
    ?assertMatch(#{state := scheduled}, get(T, <<"s">>)).

at_most_one_queued_copy(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    [ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"n">> => N}, #{priority => N}) || N <- lists:seq(1, 5)],
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    ?assertMatch(#{pending := 1, scheduled := 0}, couch_workers:job_counts(T)),
    ?assertMatch(#{priority := 5, info := #{<<"n">> := 5}}, get(T, <<"j">>)),
    {ok, _} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    %% Running: resubmits wait in the record, one of them (the last).
    [ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"n">> => N}, #{}) || N <- [6, 7]],
    ?assertEqual(0, couch_workers:job_pending_count(T)).

a_resubmitted_run_ends_queued_whatever_its_end(#{type := T, worker := W}) ->
    Ends = [
        {fail_no_retry, fun(J) -> couch_workers:job_fail(J, #{<<"e">> => 1}, #{retry => false}) end},
        {fail, fun(J) -> couch_workers:job_fail(J, #{<<"e">> => 1}, #{delay => 60000}) end},
        {release, fun(J) -> couch_workers:job_release(J, #{delay => 60000, info => #{<<"old">> => 1}}) end},
        {finish, fun(J) -> couch_workers:job_finish(J, #{}) end}
    ],
    lists:foreach(
        fun({Name, End}) ->
            Id = atom_to_binary(Name),
            ok = couch_workers:job_add(T, Id, #{<<"v">> => 1}, #{max_attempts => 1, priority => 9}),
            {ok, J} = couch_workers:job_accept(W, #{}),
            ok = couch_workers:job_resubmit(T, Id, #{<<"v">> => 2}, #{priority => 1}),
            ok = End(J),
            ?assertMatch(
                #{state := pending, attempts := 0, error := null, priority := 1, info := #{<<"v">> := 2}},
                get(T, Id)
            ),
            ok = couch_workers:job_remove(T, Id)
        end,
        Ends
    ).

cancel_or_remove_wins_over_a_waiting_resubmission(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_resubmit(T, <<"c">>, #{<<"v">> => 2}, #{}),
    ok = couch_workers:job_cancel(T, <<"c">>),
    ?assertEqual({error, canceled}, couch_workers:job_update(J1, #{})),
    ?assertMatch(#{state := canceled}, get(T, <<"c">>)),
    ok = couch_workers:job_add(T, <<"r">>, #{}, #{}),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_resubmit(T, <<"r">>, #{<<"v">> => 2}, #{}),
    ok = couch_workers:job_remove(T, <<"r">>),
    ?assertEqual({error, not_found}, couch_workers:job_finish(J2, #{})),
    ?assertEqual(not_found, job_state(T, <<"r">>)),
    ?assertMatch(#{pending := 0, running := 0, canceled := 1}, couch_workers:job_counts(T)).

%% The worker of a job resubmitted with a schedule leaves: the job is
%% scheduled, and an acceptor already waiting gets it at its time (the
%% failover wakes the dispatchers for the new earliest schedule).
a_resubmitted_schedule_survives_its_workers_exit(#{type := T}) ->
    W1 = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    {ok, _} = couch_workers:job_accept(W1, #{}),
    %% 3 s: the read below must come before it falls due (with 400 ms,
    %% a loaded machine's stall made the read see it due, `pending`).
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{delay => 3000}),
    Self = self(),
    spawn_link(fun() ->
        W2 = register_worker(T, <<"w2">>),
        Self ! {accepted, couch_workers:job_accept(W2, #{timeout => 30000}), now_ms()}
    end),
    timer:sleep(200),
    ok = couch_workers:worker_unregister(W1),
    {ok, #{state := scheduled, run_at := RunAt}} = couch_workers:job_get(T, <<"j">>),
    receive
        {accepted, R, At} ->
            ?assertMatch({ok, #{id := <<"j">>, info := #{<<"v">> := 2}, attempts := 1}}, R),
            ?assert(At >= RunAt),
            %% At its time, not at the end of the 30 s wait (a loaded
            %% machine may take seconds).
            ?assert(At - RunAt < 10000)
    after 32000 -> error(no_accept)
    end.

subscribers_see_every_resubmit_never_removed(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 0}, #{}),
    {ok, Sub, _} = couch_workers:job_subscribe(T, <<"j">>, self()),
    Wait = fun(Pred) -> wait_job(Sub, Pred, 5000) end,
    %% pending -> pending (new info)
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 1}, #{}),
    Wait(fun(#{info := I}) -> I =:= #{<<"v">> => 1} end),
    %% pending -> scheduled
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{delay => 60000}),
    Wait(fun(#{state := S}) -> S =:= scheduled end),
    %% scheduled -> pending
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 3}, #{delay => 0}),
    Wait(fun(#{state := S}) -> S =:= pending end),
    %% running -> pending after its finish
    {ok, J} = couch_workers:job_accept(W, #{}),
    Wait(fun(#{state := S}) -> S =:= running end),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 4}, #{}),
    ok = couch_workers:job_finish(J, #{}),
    Wait(fun(#{state := S, info := I}) -> S =:= pending andalso I =:= #{<<"v">> => 4} end),
    %% canceled -> pending
    ok = couch_workers:job_cancel(T, <<"j">>),
    Wait(fun(#{state := S}) -> S =:= canceled end),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 5}, #{}),
    Wait(fun(#{state := S}) -> S =:= pending end),
    no_job_msg(Sub, 300),
    ok = couch_workers:job_unsubscribe(Sub).

if_vs_acts_only_on_that_version(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{}),
    #{vs := VS1} = get(T, <<"j">>),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{if_vs => VS1}),
    #{vs := VS2, info := #{<<"v">> := 2}} = get(T, <<"j">>),
    ?assert(VS2 > VS1),
    %% Someone else wrote first: nothing written.
    ?assertEqual({error, changed}, couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 3}, #{if_vs => VS1})),
    ?assertMatch(#{vs := VS2, info := #{<<"v">> := 2}}, get(T, <<"j">>)),
    ?assertEqual({error, changed}, couch_workers:job_remove(T, <<"j">>, #{if_vs => VS1})),
    ?assertMatch(#{vs := VS2}, get(T, <<"j">>)),
    ?assertEqual({error, changed}, couch_workers:job_resubmit(T, <<"absent">>, #{}, #{<<"if_vs">> => VS1})),
    ?assertEqual(not_found, job_state(T, <<"absent">>)),
    ?assertEqual({error, not_found}, couch_workers:job_remove(T, <<"absent">>, #{if_vs => VS1})),
    ?assertEqual(ok, couch_workers:job_remove(T, <<"j">>, #{if_vs => VS2})),
    ?assertEqual(not_found, job_state(T, <<"j">>)),
    ok = couch_workers:job_add(T, <<"k">>, #{}, #{}),
    ?assertEqual(ok, couch_workers:job_remove(T, <<"k">>, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_remove(T, <<"k">>, #{})).

%% Many processes read the job, then each resubmits its own info with the
%% vs it read: exactly one wins each round, the others get `changed'.
if_vs_races_from_many_processes(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"by">> => none}, #{}),
    N = 8,
    lists:foreach(
        fun(Round) ->
            #{vs := VS} = get(T, <<"j">>),
            Self = self(),
            Go = make_ref(),
            Pids = [
                spawn_link(fun() ->
                    receive Go -> ok end,
                    Self ! {done, self(), I, couch_workers:job_resubmit(T, <<"j">>, #{<<"by">> => I}, #{if_vs => VS})}
                end)
             || I <- lists:seq(1, N)
            ],
            [P ! Go || P <- Pids],
            Results = [receive {done, P, I, R} -> {I, R} after 10000 -> error(no_answer) end || P <- Pids],
            Winners = [I || {I, ok} <- Results],
            ?assertEqual(1, length(Winners), {round, Round, Results}),
            ?assertEqual(N - 1, length([x || {_, {error, changed}} <- Results])),
            [Winner] = Winners,
            ?assertMatch(#{info := #{<<"by">> := Winner}}, get(T, <<"j">>))
        end,
        lists:seq(1, 5)
    ),
    ?assertEqual(1, couch_workers:job_pending_count(T)).

bad_input_writes_nothing(#{type := T}) ->
    ?assertError(badarg, couch_workers:job_resubmit(T, 1, #{}, #{})),
    ?assertError(badarg, couch_workers:job_resubmit(t, <<"j">>, #{}, #{})),
    ?assertError(badarg, couch_workers:job_resubmit(T, <<"j">>, [], #{})),
    ?assertError(badarg, couch_workers:job_resubmit(T, <<"j">>, #{}, [])),
    ?assertError(badarg, couch_workers:job_remove(T, <<"j">>, [])),
    ?assertError(badarg, couch_workers:job_remove(T, j, #{})),
    ?assertEqual({error, invalid_vs}, couch_workers:job_resubmit(T, <<"j">>, #{}, #{if_vs => <<1, 2>>})),
    ?assertEqual({error, invalid_vs}, couch_workers:job_resubmit(T, <<"j">>, #{}, #{if_vs => 12})),
    ?assertEqual({error, invalid_vs}, couch_workers:job_remove(T, <<"j">>, #{if_vs => "vs"})),
    ?assertEqual({error, invalid_schedule}, couch_workers:job_resubmit(T, <<"j">>, #{}, #{delay => 1, run_at => 1})),
    ?assertEqual({error, invalid_max_attempts}, couch_workers:job_resubmit(T, <<"j">>, #{}, #{max_attempts => 0})),
    ?assertEqual({error, invalid_keep}, couch_workers:job_resubmit(T, <<"j">>, #{}, #{keep => -2})),
    ?assertEqual({error, invalid_priority}, couch_workers:job_resubmit(T, <<"j">>, #{}, #{priority => 1 bsl 64})),
    ?assertEqual({error, invalid_info}, couch_workers:job_resubmit(T, <<"j">>, #{p => self()}, #{})),
    ?assertEqual({error, key_too_large}, couch_workers:job_resubmit(T, binary:copy(<<"k">>, 10001), #{}, #{})),
    ?assertEqual(not_found, job_state(T, <<"j">>)),
    ?assertEqual([], [X || X <- couch_workers:job_types(), X =:= T]).
