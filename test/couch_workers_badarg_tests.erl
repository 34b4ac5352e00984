%% @doc Bad input of every kind: shapes (badarg), options JSON cannot hold,
%% bad timeouts, FoundationDB's size limits, unknown references, and the
%% NIF boundary itself (wrong shapes, panics). Nothing is ever written.
-module(couch_workers_badarg_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, recv_membership/2, no_membership/2]).

badarg_test_() ->
    couch_workers_test_util:app_fixture("couch_workers bad input", fun setup/0, fun teardown/1, [
        ?TDEF_FE(register_non_binary_type_or_id),
        ?TDEF_FE(register_non_map_options),
        ?TDEF_FE(register_non_pid),
        ?TDEF_FE(options_json_cannot_hold),
        ?TDEF_FE(options_too_deep),
        ?TDEF_FE(bad_timeouts),
        ?TDEF_FE(good_timeouts),
        ?TDEF_FE(key_too_large),
        ?TDEF_FE(value_too_large),
        ?TDEF_FE(nothing_written_on_errors),
        ?TDEF_FE(unknown_refs_are_ok),
        ?TDEF_FE(subscribe_bad_arguments),
        ?TDEF_FE(subscribe_type_too_large),
        ?TDEF_FE(get_workers_of_anything),
        ?TDEF_FE(nif_shape_checks),
        ?TDEF_FE(nif_panic_becomes_error)
    ]).

setup() ->
    #{type => unique_type("bt")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

register_non_binary_type_or_id(#{type := T}) ->
    Self = self(),
    ?assertError(badarg, couch_workers:worker_register(atom_type, <<"id">>, #{}, Self)),
    ?assertError(badarg, couch_workers:worker_register("list_type", <<"id">>, #{}, Self)),
    ?assertError(badarg, couch_workers:worker_register(T, 42, #{}, Self)),
    ?assertError(badarg, couch_workers:worker_register(T, "id", #{}, Self)),
    ?assertError(badarg, couch_workers:worker_register(T, {id}, #{}, Self)),
    ?assertError(badarg, couch_workers:worker_register(<<1:7>>, <<"id">>, #{}, Self)).

register_non_map_options(#{type := T}) ->
    Self = self(),
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, [], Self)),
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, [{timeout, 5}], Self)),
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, undefined, Self)),
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, <<"{}">>, Self)).

register_non_pid(#{type := T}) ->
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, #{}, self)),
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, #{}, make_ref())),
    ?assertError(badarg, couch_workers:worker_register(T, <<"id">>, #{}, "<0.1.0>")).

options_json_cannot_hold(#{type := T}) ->
    Bad = [
        #{p => self()},
        #{r => make_ref()},
        #{t => {1, 2}},
        #{f => fun() -> ok end},
        #{port => hd(erlang:ports())},
        #{nested => #{deeper => [1, {tuple}]}},
        #{big => 1 bsl 64},
        #{neg => -(1 bsl 63) - 1},
        #{utf8 => <<255, 254>>},
        #{bits => <<1:3>>},
        #{improper => [1 | 2]},
        #{{tuple_key} => 1},
        #{1 => <<"integer key">>},
        #{<<255>> => <<"non-UTF-8 key">>},
        %% The same key as atom and binary: one JSON object cannot hold both.
        #{a => 1, <<"a">> => 2}
    ],
    [
        ?assertEqual({error, invalid_options}, couch_workers:worker_register(T, <<"id">>, Opts, self()))
     || Opts <- Bad
    ].

options_too_deep(#{type := T}) ->
    %% 64 nested containers are fine, 65 are not.
    Ok = nest(63, #{}),
    TooDeep = nest(64, #{}),
    Ref = couch_workers:worker_register(T, <<"deep">>, Ok, self()),
    ?assert(is_reference(Ref)),
    ok = couch_workers:worker_unregister(Ref),
    ?assertEqual({error, invalid_options}, couch_workers:worker_register(T, <<"deeper">>, TooDeep, self())),
    ?assertEqual(
        {error, invalid_options}, couch_workers:worker_register(T, <<"deeper">>, #{l => nest_list(70)}, self())
    ).

bad_timeouts(#{type := T}) ->
    [
        ?assertEqual({error, invalid_timeout}, couch_workers:worker_register(T, <<"id">>, Opts, self()))
     || Opts <- [
            #{timeout => 0},
            #{timeout => -1},
            #{timeout => <<"x">>},
            #{timeout => 1.5},
            #{timeout => infinity},
            #{timeout => null},
            #{timeout => [5]},
            #{<<"timeout">> => 0},
            #{<<"timeout">> => <<"15">>}
        ]
    ],
    %% Over a week is refused by the store side (a unit mistake).
    ?assertEqual(
        {error, invalid_timeout}, couch_workers:worker_register(T, <<"id">>, #{timeout => 7 * 24 * 3600 + 1}, self())
    ).

good_timeouts(#{type := T}) ->
    R1 = couch_workers:worker_register(T, <<"a">>, #{timeout => 1}, self()),
    R2 = couch_workers:worker_register(T, <<"b">>, #{<<"timeout">> => 30}, self()),
    R3 = couch_workers:worker_register(T, <<"c">>, #{timeout => 7 * 24 * 3600}, self()),
    [?assert(is_reference(R)) || R <- [R1, R2, R3]],
    [ok = couch_workers:worker_unregister(R) || R <- [R1, R2, R3]].

key_too_large(#{type := T}) ->
    Big = binary:copy(<<"k">>, 10001),
    ?assertEqual({error, key_too_large}, couch_workers:worker_register(T, Big, #{}, self())),
    ?assertEqual({error, key_too_large}, couch_workers:worker_register(Big, <<"id">>, #{}, self())),
    %% Just under the limit (with the key's prefix) works.
    Fits = binary:copy(<<"k">>, 9900),
    Ref = couch_workers:worker_register(T, Fits, #{}, self()),
    ?assert(is_reference(Ref)),
    ok = couch_workers:worker_unregister(Ref).

value_too_large(#{type := T}) ->
    Huge = #{blob => binary:copy(<<"v">>, 100001)},
    ?assertEqual({error, value_too_large}, couch_workers:worker_register(T, <<"id">>, Huge, self())),
    %% Many small values add up, too (and are refused without converting
    %% all of them).
    Many = maps:from_list([{integer_to_binary(I), binary:copy(<<"x">>, 100)} || I <- lists:seq(1, 2000)]),
    ?assertEqual({error, value_too_large}, couch_workers:worker_register(T, <<"id">>, Many, self())),
    LongList = #{l => lists:duplicate(200000, 1)},
    ?assertEqual({error, value_too_large}, couch_workers:worker_register(T, <<"id">>, LongList, self())),
    %% Just under the limit works.
    Fits = #{blob => binary:copy(<<"v">>, 99000)},
    Ref = couch_workers:worker_register(T, <<"id">>, Fits, self()),
    ?assert(is_reference(Ref)),
    ok = couch_workers:worker_unregister(Ref).

nothing_written_on_errors(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    {error, invalid_options} = couch_workers:worker_register(T, <<"a">>, #{p => self()}, self()),
    {error, invalid_timeout} = couch_workers:worker_register(T, <<"b">>, #{timeout => 0}, self()),
    {error, value_too_large} = couch_workers:worker_register(T, <<"c">>, #{v => binary:copy(<<"v">>, 100001)}, self()),
    {error, key_too_large} = couch_workers:worker_register(T, binary:copy(<<"k">>, 10001), #{}, self()),
    no_membership(S, 300),
    ?assertMatch({ok, _, W} when W =:= #{}, couch_workers:get_workers(T)),
    ok = couch_workers:membership_unsubscribe(S).

unknown_refs_are_ok(#{}) ->
    ?assertEqual(ok, couch_workers:worker_unregister(make_ref())),
    ?assertEqual(ok, couch_workers:worker_unregister(not_a_ref)),
    ?assertEqual(ok, couch_workers:worker_unregister(<<"x">>)),
    ?assertEqual(ok, couch_workers:membership_unsubscribe(make_ref())),
    ?assertEqual(ok, couch_workers:membership_unsubscribe(not_a_ref)),
    ?assertEqual(ok, couch_workers:membership_unsubscribe(42)).

subscribe_bad_arguments(#{type := T}) ->
    ?assertError(badarg, couch_workers:membership_subscribe(not_binary, nil, self())),
    ?assertError(badarg, couch_workers:membership_subscribe("list", nil, self())),
    ?assertError(badarg, couch_workers:membership_subscribe(T, "module", self())),
    ?assertError(badarg, couch_workers:membership_subscribe(T, nil, not_a_pid)),
    ?assertError(badarg, couch_workers:membership_subscribe(T, {m}, self())),
    %% A module that does not exist: its calls crash, are caught and
    %% logged; the subscription itself works.
    S = couch_workers:membership_subscribe(T, couch_workers_no_such_module, self()),
    ?assert(is_reference(S)),
    ok = couch_workers:membership_unsubscribe(S).

subscribe_type_too_large(#{}) ->
    Big = binary:copy(<<"t">>, 10001),
    ?assertEqual({error, key_too_large}, couch_workers:membership_subscribe(Big, nil, self())),
    ?assertEqual({error, not_found}, couch_workers:get_workers(Big)).

get_workers_of_anything(#{}) ->
    ?assertEqual({error, not_found}, couch_workers:get_workers(<<"never_subscribed">>)),
    ?assertEqual({error, not_found}, couch_workers:get_workers(not_binary)),
    ?assertEqual({error, not_found}, couch_workers:get_workers(123)).

nif_shape_checks(#{type := T}) ->
    %% Straight at the NIF: wrong shapes raise badarg, never crash.
    Ref = make_ref(),
    ?assertError(badarg, couch_workers_nif:worker_register(not_a_ref, T, <<"id">>, #{})),
    ?assertError(badarg, couch_workers_nif:worker_register(Ref, T, <<"id">>, [])),
    ?assertError(badarg, couch_workers_nif:worker_register(Ref, T, 1, #{})),
    ?assertError(badarg, couch_workers_nif:worker_unregister(Ref, make_ref())),
    ?assertError(badarg, couch_workers_nif:worker_unregister(Ref, <<"resource">>)),
    ?assertError(badarg, couch_workers_nif:membership_watch(not_binary, tag)),
    ?assertError(badarg, couch_workers_nif:membership_watch(T, {tag, lists:seq(1, 100000)})),
    ?assertError(badarg, couch_workers_nif:membership_unwatch(make_ref())),
    ?assertError(badarg, couch_workers_nif:set_log_pid(not_a_pid)),
    ?assertError(badarg, couch_workers_nif:start(not_a_ref, #{})),
    ?assertError(badarg, couch_workers_nif:stop(not_a_ref)),
    %% A second start while running is refused at once.
    ?assertEqual({error, already_started}, couch_workers_nif:start(make_ref(), #{})),
    %% A registration handle is not a watch handle and vice versa.
    NifRef = make_ref(),
    ok = couch_workers_nif:worker_register(NifRef, T, <<"h">>, #{}),
    {ok, Reg} = couch_workers_nif:wait(NifRef, 5000),
    ?assertError(badarg, couch_workers_nif:membership_unwatch(Reg)),
    {ok, Watch} = couch_workers_nif:membership_watch(T, tag),
    ?assertError(badarg, couch_workers_nif:worker_unregister(make_ref(), Watch)),
    ok = couch_workers_nif:membership_unwatch(Watch),
    UnRef = make_ref(),
    ok = couch_workers_nif:worker_unregister(UnRef, Reg),
    ?assertEqual(ok, couch_workers_nif:wait(UnRef, 5000)),
    %% Unregistering twice is fine.
    UnRef2 = make_ref(),
    ok = couch_workers_nif:worker_unregister(UnRef2, Reg),
    ?assertEqual(ok, couch_workers_nif:wait(UnRef2, 5000)),
    flush_watch_messages().

nif_panic_becomes_error(#{}) ->
    Ref = make_ref(),
    ?assertEqual(ok, couch_workers_nif:test_panic(Ref)),
    ?assertEqual({error, {panic, <<"couch_workers test panic">>}}, couch_workers_nif:wait(Ref, 5000)),
    %% Exactly one reply.
    ?assertEqual({error, timeout}, couch_workers_nif:wait(Ref, 200)),
    %% The runtime survives it.
    couch_workers_test_util:settled_stats(#{running => true, reapers => 1}).

%% ---- helpers -------------------------------------------------------------

nest(0, Inner) -> Inner;
nest(N, Inner) -> nest(N - 1, #{n => Inner}).

nest_list(0) -> [];
nest_list(N) -> [nest_list(N - 1)].

flush_watch_messages() ->
    receive
        {couch_workers_membership_changed, tag, _, _, _} -> flush_watch_messages();
        {couch_workers_membership_delta, tag, _, _, _, _} -> flush_watch_messages()
    after 100 -> ok
    end.
