%% @doc `job_accept(Ref, ...)' takes a job for the registration `Ref'
%% names, never for another registration of the same worker id (waiters
%% were once keyed by worker id only). A caller still waiting
%% in `job_accept(Ref1, ...)' after `Ref1' is over gets `not_found' when a
%% job arrives, and the job stays for the registration that holds the id
%% now (`Ref2').
-module(couch_workers_accept_incarnation_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

accept_incarnation_test_() ->
    couch_workers_test_util:app_fixture("couch_workers: an accept is for its registration only", fun setup/0, fun teardown/1, [
        ?TDEF_FE(waiter_of_an_unregistered_ref_takes_no_job_of_the_next, 30),
        ?TDEF_FE(waiter_of_a_dead_owner_takes_no_job_of_the_next, 30),
        ?TDEF_FE(nif_accept_of_a_registration_of_another_type_is_badarg)
    ]).

setup() ->
    #{type => unique_type("ai")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

waiter_of_an_unregistered_ref_takes_no_job_of_the_next(#{type := T}) ->
    Ref1 = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    Waiting = waiting_accept(Ref1),
    ok = couch_workers:worker_unregister(Ref1),
    Ref2 = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    ?assertNotEqual(Ref1, Ref2),
    a_job_for(T, Ref2, Waiting).

%% The same when `Ref1' ended by its owner's exit (the waiting caller is
%% another process).
waiter_of_a_dead_owner_takes_no_job_of_the_next(#{type := T}) ->
    Self = self(),
    Owner = spawn(fun() ->
        Self ! {ref, couch_workers:worker_register(T, <<"w">>, #{}, self())},
        receive
            never -> ok
        end
    end),
    Ref1 =
        receive
            {ref, R} -> R
        after 10000 -> error(no_registration)
        end,
    Waiting = waiting_accept(Ref1),
    exit(Owner, kill),
    wait_for(fun() -> couch_workers_local:lookup(Ref1) =:= error end, 5000),
    Ref2 = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    ?assertNotEqual(Ref1, Ref2),
    a_job_for(T, Ref2, Waiting).

%% The NIF takes the worker as its registration; one of another type is
%% a wrong shape, not a worker to look up.
nif_accept_of_a_registration_of_another_type_is_badarg(#{type := T}) ->
    Ref = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    {ok, T, <<"w">>, Reg} = couch_workers_local:registration(Ref),
    ?assertError(badarg, couch_workers_nif:job_accept(make_ref(), <<T/binary, "-other">>, Reg, 0)),
    ?assertError(badarg, couch_workers_nif:job_accept(make_ref(), T, make_ref(), 0)),
    ?assertEqual(error, couch_workers_local:registration(make_ref())),
    ?assertEqual(error, couch_workers_local:registration(not_a_ref)),
    ok = couch_workers:worker_unregister(Ref),
    ?assertEqual(error, couch_workers_local:registration(Ref)).

%% ---- helpers -------------------------------------------------------------

%% A process waiting in `job_accept(Ref, #{timeout => 20000})'; returns
%% once the dispatcher holds its waiter.
waiting_accept(Ref) ->
    Self = self(),
    Before = maps:get(job_waiters, couch_workers:stats()),
    Pid = spawn(fun() -> Self ! {accepted, self(), couch_workers:job_accept(Ref, #{timeout => 20000})} end),
    wait_for(fun() -> maps:get(job_waiters, couch_workers:stats()) > Before end, 5000),
    Pid.

%% Adds a job: the waiter of the old registration is answered
%% `not_found', and the job is the new registration's to take.
a_job_for(T, Ref2, Waiting) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Answer =
        receive
            {accepted, Waiting, A} -> A
        after 15000 -> error(old_waiter_unanswered)
        end,
    ?assertEqual({error, not_found}, Answer),
    ?assertMatch({ok, #{state := pending, worker := null, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    {ok, Job} = couch_workers:job_accept(Ref2, #{}),
    ?assertMatch(#{id := <<"j1">>, attempts := 1}, Job),
    ok = couch_workers:job_finish(Job, #{}),
    ok = couch_workers:worker_unregister(Ref2).
