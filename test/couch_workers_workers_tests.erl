%% @doc Workers: register, unregister, ownership, heartbeats, handles.
-module(couch_workers_workers_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [
    unique_type/1,
    wait_for/2,
    wait_membership/3,
    no_membership/2,
    settled_stats/1
]).

workers_test_() ->
    couch_workers_test_util:app_fixture("couch_workers workers", fun setup/0, fun teardown/1, [
        ?TDEF_FE(register_returns_ref),
        ?TDEF_FE(register_same_key_returns_same_ref),
        ?TDEF_FE(concurrent_registers_share_one_ref),
        ?TDEF_FE(same_id_other_type_is_another_worker),
        ?TDEF_FE(options_visible_with_binary_keys),
        ?TDEF_FE(default_timeout_is_stored_options_only),
        ?TDEF_FE(unregister_removes_worker),
        ?TDEF_FE(unregister_twice_is_ok),
        ?TDEF_FE(register_again_after_unregister),
        ?TDEF_FE(register_queued_behind_unregister),
        ?TDEF_FE(pid_exit_unregisters),
        ?TDEF_FE(pid_exit_unregisters_all_its_workers),
        ?TDEF_FE(dead_pid_register_is_removed),
        ?TDEF_FE(heartbeats_keep_worker_alive, 15),
        ?TDEF_FE(dropped_resource_removes_worker),
        ?TDEF_FE(stats_count_heartbeats)
    ]).

%% EUnit runs each test in a process of its own, not the one that ran
%% setup/0: each test subscribes itself (subscribe/1), and its exit ends
%% the subscription.
setup() ->
    #{type => unique_type("wt")}.

teardown(#{}) ->
    ok.

%% Subscribes the calling process to T and takes the initial (empty)
%% delivery.
subscribe(T) ->
    Ref = couch_workers:membership_subscribe(T, nil, self()),
    ?assert(is_reference(Ref)),
    {_, W, _} = wait_membership(Ref, fun(_) -> true end, 5000),
    ?assertEqual(#{}, W),
    Ref.

%% ---- tests ---------------------------------------------------------------

register_returns_ref(#{type := T}) ->
    S = subscribe(T),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assert(is_reference(Ref)),
    {_, W, _} = wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ?assertEqual([<<"w1">>], maps:keys(W)),
    ok = couch_workers:worker_unregister(Ref).

register_same_key_returns_same_ref(#{type := T}) ->
    S = subscribe(T),
    Ref1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    Ref2 = couch_workers:worker_register(T, <<"w1">>, #{role => other}, self()),
    ?assert(is_reference(Ref1)),
    ?assertEqual(Ref1, Ref2),
    {_, W, _} = wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    %% The second call changed nothing: the first options stand.
    ?assertEqual(#{<<"w1">> => #{}}, W),
    no_membership(S, 300),
    ok = couch_workers:worker_unregister(Ref1).

concurrent_registers_share_one_ref(#{type := T}) ->
    S = subscribe(T),
    Self = self(),
    Pids = [
        spawn_link(fun() -> Self ! {reg, self(), couch_workers:worker_register(T, <<"same">>, #{}, Self)} end)
     || _ <- lists:seq(1, 8)
    ],
    Refs = [
        receive
            {reg, P, R} -> R
        after 10000 -> error(timeout)
        end
     || P <- Pids
    ],
    [Ref | _] = Refs,
    ?assert(is_reference(Ref)),
    ?assertEqual([Ref], lists:usort(Refs)),
    {_, W, _} = wait_membership(S, fun(W) -> maps:is_key(<<"same">>, W) end, 5000),
    ?assertEqual(1, map_size(W)),
    ok = couch_workers:worker_unregister(Ref).

same_id_other_type_is_another_worker(#{type := T}) ->
    S = subscribe(T),
    T2 = <<T/binary, "_other">>,
    S2 = couch_workers:membership_subscribe(T2, nil, self()),
    Ref1 = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    Ref2 = couch_workers:worker_register(T2, <<"w">>, #{}, self()),
    ?assertNotEqual(Ref1, Ref2),
    wait_membership(S, fun(W) -> maps:is_key(<<"w">>, W) end, 5000),
    wait_membership(S2, fun(W) -> maps:is_key(<<"w">>, W) end, 5000),
    ok = couch_workers:worker_unregister(Ref1),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ?assertMatch({ok, _, #{<<"w">> := _}}, couch_workers:get_workers(T2)),
    ok = couch_workers:worker_unregister(Ref2),
    ok = couch_workers:membership_unsubscribe(S2).

options_visible_with_binary_keys(#{type := T}) ->
    S = subscribe(T),
    Opts = #{
        timeout => 7,
        role => replicator,
        <<"name">> => <<"node é"/utf8>>,
        nested => #{deep => [1, -2, 2.5, true, false, null, <<"s">>, #{}]},
        big => 18446744073709551615,
        empty => []
    },
    Ref = couch_workers:worker_register(T, <<"w1">>, Opts, self()),
    ?assert(is_reference(Ref)),
    {_, W, _} = wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    Expected = #{
        <<"timeout">> => 7,
        <<"role">> => <<"replicator">>,
        <<"name">> => <<"node é"/utf8>>,
        <<"nested">> => #{<<"deep">> => [1, -2, 2.5, true, false, null, <<"s">>, #{}]},
        <<"big">> => 18446744073709551615,
        <<"empty">> => []
    },
    ?assertEqual(#{<<"w1">> => Expected}, W),
    ?assertMatch({ok, _, #{<<"w1">> := Expected}}, couch_workers:get_workers(T)),
    ok = couch_workers:worker_unregister(Ref).

default_timeout_is_stored_options_only(#{type := T}) ->
    S = subscribe(T),
    %% The default timeout is not added to the options others see.
    Ref = couch_workers:worker_register(T, <<"w1">>, #{a => 1}, self()),
    {_, W, _} = wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ?assertEqual(#{<<"w1">> => #{<<"a">> => 1}}, W),
    ok = couch_workers:worker_unregister(Ref).

unregister_removes_worker(#{type := T}) ->
    S = subscribe(T),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    Ref2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
    wait_membership(S, fun(W) -> map_size(W) =:= 2 end, 5000),
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)),
    {_, W, _} = wait_membership(S, fun(W) -> not maps:is_key(<<"w1">>, W) end, 5000),
    ?assertEqual([<<"w2">>], maps:keys(W)),
    ok = couch_workers:worker_unregister(Ref2),
    wait_membership(S, fun(W1) -> W1 =:= #{} end, 5000).

unregister_twice_is_ok(#{type := T}) ->
    S = subscribe(T),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)),
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000).

register_again_after_unregister(#{type := T}) ->
    S = subscribe(T),
    Ref1 = couch_workers:worker_register(T, <<"w1">>, #{v => 1}, self()),
    ok = couch_workers:worker_unregister(Ref1),
    Ref2 = couch_workers:worker_register(T, <<"w1">>, #{v => 2}, self()),
    ?assert(is_reference(Ref2)),
    ?assertNotEqual(Ref1, Ref2),
    {_, W, _} = wait_membership(S, fun(W) -> W =:= #{<<"w1">> => #{<<"v">> => 2}} end, 5000),
    ?assertEqual(#{<<"w1">> => #{<<"v">> => 2}}, W),
    %% The old Ref is stale: unregistering it leaves the new worker alone.
    ok = couch_workers:worker_unregister(Ref1),
    no_membership(S, 300),
    ok = couch_workers:worker_unregister(Ref2).

register_queued_behind_unregister(#{type := T}) ->
    %% An unregister and a register of the same key reach the server in
    %% that order (it is suspended while they queue up): the register waits
    %% for the unregister's write, so the late removal cannot delete the
    %% new registration.
    S = subscribe(T),
    Self = self(),
    R1 = couch_workers:worker_register(T, <<"w">>, #{v => 1}, Self),
    wait_membership(S, fun(W) -> maps:is_key(<<"w">>, W) end, 5000),
    Local = whereis(couch_workers_local),
    ok = sys:suspend(Local),
    try
        spawn_link(fun() -> Self ! {unreg, couch_workers:worker_unregister(R1)} end),
        wait_for(fun() -> queue_len(Local) >= 1 end, 2000),
        spawn_link(fun() -> Self ! {reg, couch_workers:worker_register(T, <<"w">>, #{v => 2}, Self)} end),
        wait_for(fun() -> queue_len(Local) >= 2 end, 2000)
    after
        ok = sys:resume(Local)
    end,
    receive {unreg, U} -> ?assertEqual(ok, U) after 5000 -> error(no_unregister) end,
    R2 = receive {reg, R} -> R after 5000 -> error(no_register) end,
    ?assert(is_reference(R2)),
    ?assertNotEqual(R1, R2),
    wait_membership(S, fun(W) -> W =:= #{<<"w">> => #{<<"v">> => 2}} end, 5000),
    no_membership(S, 500),
    ?assertMatch({ok, _, #{<<"w">> := #{<<"v">> := 2}}}, couch_workers:get_workers(T)),
    ok = couch_workers:worker_unregister(R2).

pid_exit_unregisters(#{type := T}) ->
    S = subscribe(T),
    Owner = spawn(fun() -> receive stop -> ok end end),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, Owner),
    ?assert(is_reference(Ref)),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    Owner ! stop,
    {_, W, _} = wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ?assertEqual(#{}, W),
    %% Its Ref is stale now.
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)).

pid_exit_unregisters_all_its_workers(#{type := T}) ->
    S = subscribe(T),
    Owner = spawn(fun() -> receive stop -> ok end end),
    _ = [couch_workers:worker_register(T, Id, #{}, Owner) || Id <- [<<"a">>, <<"b">>, <<"c">>]],
    wait_membership(S, fun(W) -> map_size(W) =:= 3 end, 5000),
    exit(Owner, kill),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000).

dead_pid_register_is_removed(#{type := T}) ->
    S = subscribe(T),
    Dead = spawn(fun() -> ok end),
    Mon = erlang:monitor(process, Dead),
    receive {'DOWN', Mon, process, Dead, _} -> ok end,
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, Dead),
    ?assert(is_reference(Ref)),
    %% Registered, then removed at once since its owner is gone: the last
    %% delivery (a later versionstamp than the initial one) is empty.
    {_, W, _} = wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ?assertEqual(#{}, W),
    ?assertEqual({error, not_found}, wait_gone(T, <<"w1">>)),
    ?assertEqual(ok, couch_workers:worker_unregister(Ref)).

heartbeats_keep_worker_alive(#{type := T}) ->
    S = subscribe(T),
    Ref = couch_workers:worker_register(T, <<"w1">>, #{timeout => 1}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    %% Three timeouts long: without heartbeats the reaper would have
    %% removed it after about one.
    no_membership(S, 3000),
    ?assertMatch({ok, _, #{<<"w1">> := #{<<"timeout">> := 1}}}, couch_workers:get_workers(T)),
    ok = couch_workers:worker_unregister(Ref),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000).

dropped_resource_removes_worker(#{type := T}) ->
    S = subscribe(T),
    %% Register through the NIF in a process that then exits without
    %% unregistering: the only reference to the registration goes, the
    %% resource is garbage collected, and its destructor removes the
    %% worker.
    Self = self(),
    couch_workers_test_util:gc_servers(),
    Before = maps:get(registrations, couch_workers:stats()),
    {Pid, Mon} = spawn_monitor(fun() ->
        NifRef = make_ref(),
        ok = couch_workers_nif:worker_register(NifRef, T, <<"dropped">>, #{}),
        {ok, Reg} = couch_workers_nif:wait(NifRef, 5000),
        Self ! {registered, self(), is_reference(Reg)},
        receive stop -> ok end
    end),
    receive {registered, Pid, IsRef} -> ?assert(IsRef) after 5000 -> error(no_registration) end,
    wait_membership(S, fun(W) -> maps:is_key(<<"dropped">>, W) end, 5000),
    ?assertEqual(Before + 1, maps:get(registrations, couch_workers:stats())),
    Pid ! stop,
    receive {'DOWN', Mon, process, Pid, normal} -> ok end,
    wait_membership(S, fun(W) -> not maps:is_key(<<"dropped">>, W) end, 5000),
    settled_stats(#{registrations => Before}).

stats_count_heartbeats(#{type := T}) ->
    S = subscribe(T),
    #{heartbeats := H0} = settled_stats(#{running => true, reapers => 1}),
    R1 = couch_workers:worker_register(T, <<"a">>, #{}, self()),
    R2 = couch_workers:worker_register(T, <<"b">>, #{}, self()),
    wait_membership(S, fun(W) -> map_size(W) =:= 2 end, 5000),
    settled_stats(#{heartbeats => H0 + 2}),
    ok = couch_workers:worker_unregister(R1),
    ok = couch_workers:worker_unregister(R2),
    settled_stats(#{heartbeats => H0}).

%% ---- helpers -------------------------------------------------------------

queue_len(Pid) ->
    {message_queue_len, N} = process_info(Pid, message_queue_len),
    N.

wait_gone(T, Id) ->
    wait_for(
        fun() ->
            case couch_workers:get_workers(T) of
                {ok, _, W} -> (not maps:is_key(Id, W)) andalso {error, not_found};
                Other -> Other
            end
        end,
        5000
    ).
