%% @doc Bad input to the job API, of every kind: shapes (badarg), values
%% (`{error, Reason}'), FoundationDB's size limits, handles that are not
%% handles, unknown references, and the NIF boundary itself. Nothing is
%% ever written, and the application keeps running.
-module(couch_workers_jobs_badarg_tests).

-include("couch_workers_test.hrl").

%% The NIF's options tuple with only a priority.
-define(OPTS(P), {P, undefined, undefined, undefined}).

-import(couch_workers_test_util, [unique_type/1, register_worker/2, register_worker/3, settled_stats/1]).

-define(KEY_LIMIT, 10000).
-define(VALUE_LIMIT, 100000).

badarg_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job queue: bad input", fun setup/0, fun teardown/1, [
        ?TDEF_FE(non_binary_type_or_id),
        ?TDEF_FE(non_map_info_or_opts),
        ?TDEF_FE(bad_priorities),
        ?TDEF_FE(good_priorities),
        ?TDEF_FE(bad_timeouts),
        ?TDEF_FE(info_json_cannot_hold),
        ?TDEF_FE(job_that_is_not_a_handle),
        ?TDEF_FE(add_many_bad_shapes),
        ?TDEF_FE(key_too_large),
        ?TDEF_FE(value_too_large),
        ?TDEF_FE(subscribe_bad_arguments),
        ?TDEF_FE(unknown_refs),
        ?TDEF_FE(nif_shape_checks),
        ?TDEF_FE(big_terms_take_the_dirty_twins),
        ?TDEF_FE(nothing_written_and_app_running)
    ]).

setup() ->
    #{type => unique_type("jb")}.

teardown(#{}) ->
    ok.

%% Every call made with bad input in these tests names this type or a
%% type derived from it; nothing_written_and_app_running checks the
%% store afterwards (each test also checks its own type).
assert_nothing_written(T) ->
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"id">>)).

%% ---- tests ---------------------------------------------------------------

non_binary_type_or_id(#{type := T}) ->
    BadBins = [atom, "list", 42, {t}, <<1:7>>, #{}, self()],
    lists:foreach(
        fun(Bad) ->
            ?assertError(badarg, couch_workers:job_add(Bad, <<"id">>, #{}, #{})),
            ?assertError(badarg, couch_workers:job_add(T, Bad, #{}, #{})),
            ?assertError(badarg, couch_workers:job_add_many(Bad, [])),
            ?assertError(badarg, couch_workers:job_cancel(Bad, <<"id">>)),
            ?assertError(badarg, couch_workers:job_cancel(T, Bad)),
            ?assertError(badarg, couch_workers:job_remove(Bad, <<"id">>)),
            ?assertError(badarg, couch_workers:job_remove(T, Bad)),
            ?assertError(badarg, couch_workers:job_get(Bad, <<"id">>)),
            ?assertError(badarg, couch_workers:job_get(T, Bad)),
            ?assertError(badarg, couch_workers:job_pending_count(Bad)),
            ?assertError(badarg, couch_workers:job_subscribe(Bad, <<"id">>, self())),
            ?assertError(badarg, couch_workers:job_subscribe(T, Bad, self()))
        end,
        BadBins
    ),
    assert_nothing_written(T).

non_map_info_or_opts(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    lists:foreach(
        fun(Bad) ->
            ?assertError(badarg, couch_workers:job_add(T, <<"id">>, Bad, #{})),
            ?assertError(badarg, couch_workers:job_add(T, <<"id">>, #{}, Bad)),
            ?assertError(badarg, couch_workers:job_accept(W, Bad))
        end,
        [[], [{priority, 1}], undefined, <<"{}">>, 42]
    ),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    lists:foreach(
        fun(Bad) ->
            ?assertError(badarg, couch_workers:job_update(Job, Bad)),
            ?assertError(badarg, couch_workers:job_finish(Job, Bad))
        end,
        [[], undefined, <<"{}">>]
    ),
    ?assertMatch({ok, #{state := running, info := #{}}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ok = couch_workers:worker_unregister(W),
    assert_nothing_written(T).

bad_priorities(#{type := T}) ->
    Bad = [1.5, <<"1">>, "1", one, 1 bsl 63, -(1 bsl 63) - 1, 1 bsl 200, null],
    lists:foreach(
        fun(P) ->
            ?assertEqual({error, invalid_priority}, couch_workers:job_add(T, <<"id">>, #{}, #{priority => P})),
            ?assertEqual({error, invalid_priority}, couch_workers:job_add(T, <<"id">>, #{}, #{<<"priority">> => P})),
            ?assertEqual(
                {error, invalid_priority},
                couch_workers:job_add_many(T, [{<<"ok">>, #{}, #{}}, {<<"id">>, #{}, #{priority => P}}])
            )
        end,
        Bad
    ),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"ok">>)),
    assert_nothing_written(T).

good_priorities(#{type := T}) ->
    Edges = [-(1 bsl 63), (1 bsl 63) - 1, 0, -1, 1],
    [
        ?assertEqual(ok, couch_workers:job_add(T, integer_to_binary(I), #{}, #{priority => P}))
     || {I, P} <- lists:zip(lists:seq(1, length(Edges)), Edges)
    ],
    [
        ?assertMatch({ok, #{priority := P}}, couch_workers:job_get(T, integer_to_binary(I)))
     || {I, P} <- lists:zip(lists:seq(1, length(Edges)), Edges)
    ],
    ?assertEqual(length(Edges), couch_workers:job_pending_count(T)),
    [ok = couch_workers:job_remove(T, integer_to_binary(I)) || I <- lists:seq(1, length(Edges))].

bad_timeouts(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    lists:foreach(
        fun(Timeout) ->
            ?assertEqual({error, invalid_timeout}, couch_workers:job_accept(W, #{timeout => Timeout})),
            ?assertEqual({error, invalid_timeout}, couch_workers:job_accept(W, #{<<"timeout">> => Timeout}))
        end,
        [-1, 1.5, infinite, <<"10">>, "10", null]
    ),
    %% None of them took the job.
    ?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    %% A huge timeout is fine (capped): the job is there, taken at once.
    ?assertMatch({ok, #{id := <<"j1">>}}, couch_workers:job_accept(W, #{timeout => 1 bsl 70})),
    ok = couch_workers:job_remove(T, <<"j1">>),
    %% So is `infinity' (the contract): it waits until a job comes.
    Self = self(),
    spawn_link(fun() -> Self ! {accepted, couch_workers:job_accept(W, #{timeout => infinity})} end),
    receive {accepted, Early} -> error({accepted_without_a_job, Early}) after 300 -> ok end,
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    receive {accepted, Got} -> ?assertMatch({ok, #{id := <<"j2">>}}, Got) after 5000 -> error(no_accept) end,
    ok = couch_workers:job_remove(T, <<"j2">>),
    ok = couch_workers:worker_unregister(W).

info_json_cannot_hold(#{type := T}) ->
    Bad = [
        #{p => self()},
        #{r => make_ref()},
        #{t => {1, 2}},
        #{f => fun() -> ok end},
        #{nested => #{deeper => [1, {tuple}]}},
        #{big => 1 bsl 64},
        #{bits => <<1:3>>},
        #{bad_utf8 => <<255, 254>>},
        #{1 => one},
        #{{k} => v},
        #{improper => [1 | 2]},
        #{a => 1, <<"a">> => 2},
        deep(100)
    ],
    W = register_worker(T, <<"w1">>),
    [?assertEqual({error, invalid_info}, couch_workers:job_add(T, <<"id">>, Info, #{})) || Info <- Bad],
    [?assertEqual({error, invalid_info}, couch_workers:job_add_many(T, [{<<"id">>, Info, #{}}])) || Info <- Bad],
    assert_nothing_written(T),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"v">> => 1}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    [?assertEqual({error, invalid_info}, couch_workers:job_update(Job, Info)) || Info <- Bad],
    [?assertEqual({error, invalid_result}, couch_workers:job_finish(Job, Result)) || Result <- Bad],
    ?assertMatch({ok, #{state := running, info := #{<<"v">> := 1}}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ok = couch_workers:worker_unregister(W).

job_that_is_not_a_handle(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Got} = couch_workers:job_get(T, <<"j1">>),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    NotHandles = [
        %% What job_get and subscriptions give: no token.
        Got,
        maps:remove(token, Job),
        maps:remove(type, Job),
        maps:remove(id, Job),
        maps:remove(worker, Job),
        Job#{token := <<1, 2, 3>>},
        Job#{token := <<0:129>>},
        Job#{token := list_to_binary(lists:duplicate(17, 0))},
        Job#{token := not_a_binary},
        Job#{worker := null},
        Job#{type := atom},
        Job#{id := 42},
        #{},
        #{<<"type">> => T, <<"id">> => <<"j1">>, <<"worker">> => <<"w1">>, <<"token">> => maps:get(token, Job)},
        not_a_map,
        [],
        {job, Job}
    ],
    lists:foreach(
        fun(Bad) ->
            ?assertError(badarg, couch_workers:job_update(Bad, #{<<"x">> => 1})),
            ?assertError(badarg, couch_workers:job_finish(Bad, #{<<"x">> => 1}))
        end,
        NotHandles
    ),
    %% Still running, unchanged; the real handle works.
    ?assertMatch({ok, #{state := running, info := #{}}}, couch_workers:job_get(T, <<"j1">>)),
    ?assertEqual(ok, couch_workers:job_finish(Job, #{})),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ok = couch_workers:worker_unregister(W).

add_many_bad_shapes(#{type := T}) ->
    Bad = [
        not_a_list,
        #{},
        [{<<"id">>, #{}, #{}} | improper],
        [{<<"id">>, #{}}],
        [{<<"id">>, #{}, #{}, extra}],
        [{id, #{}, #{}}],
        [{<<"id">>, [], #{}}],
        [{<<"id">>, #{}, []}],
        [<<"id">>],
        [{<<"ok">>, #{}, #{}}, bogus]
    ],
    [?assertError(badarg, couch_workers:job_add_many(T, Jobs)) || Jobs <- Bad],
    %% A shape error wins over a bad priority earlier in the list.
    ?assertError(badarg, couch_workers:job_add_many(T, [{<<"a">>, #{}, #{priority => x}}, bogus])),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"ok">>)),
    assert_nothing_written(T).

key_too_large(#{type := T}) ->
    Big = binary:copy(<<"k">>, ?KEY_LIMIT + 1),
    W = register_worker(T, <<"w1">>),
    ?assertEqual({error, key_too_large}, couch_workers:job_add(T, Big, #{}, #{})),
    ?assertEqual({error, key_too_large}, couch_workers:job_add(Big, <<"id">>, #{}, #{})),
    ?assertEqual({error, key_too_large}, couch_workers:job_add_many(T, [{<<"a">>, #{}, #{}}, {Big, #{}, #{}}])),
    ?assertEqual({error, key_too_large}, couch_workers:job_get(T, Big)),
    ?assertEqual({error, key_too_large}, couch_workers:job_cancel(T, Big)),
    ?assertEqual({error, key_too_large}, couch_workers:job_remove(Big, <<"id">>)),
    ?assertEqual({error, key_too_large}, couch_workers:job_subscribe(T, Big, self())),
    ?assertEqual({error, key_too_large}, couch_workers:job_pending_count(Big)),
    %% A handle naming a job over the limit.
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, key_too_large}, couch_workers:job_update(Job#{id := Big}, #{})),
    ?assertEqual({error, key_too_large}, couch_workers:job_finish(Job#{id := Big}, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"a">>)),
    ?assertEqual(ok, couch_workers:job_remove(T, <<"j1">>)),
    %% Just under the limit is fine (the key holds more than the id).
    Long = binary:copy(<<"k">>, 5000),
    ?assertEqual(ok, couch_workers:job_add(T, Long, #{}, #{})),
    ?assertMatch({ok, #{id := Long}}, couch_workers:job_get(T, Long)),
    ?assertEqual(ok, couch_workers:job_remove(T, Long)),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ok = couch_workers:worker_unregister(W),
    assert_nothing_written(T).

value_too_large(#{type := T}) ->
    Huge = #{<<"blob">> => binary:copy(<<"v">>, ?VALUE_LIMIT + 1)},
    HugeList = #{<<"list">> => lists:duplicate(?VALUE_LIMIT, 1)},
    %% Small enough as JSON, too large with the rest of the record.
    Edge = #{<<"blob">> => binary:copy(<<"v">>, ?VALUE_LIMIT - 15)},
    W = register_worker(T, <<"w1">>),
    [?assertEqual({error, value_too_large}, couch_workers:job_add(T, <<"id">>, I, #{})) || I <- [Huge, HugeList, Edge]],
    ?assertEqual({error, value_too_large}, couch_workers:job_add_many(T, [{<<"a">>, #{}, #{}}, {<<"id">>, Huge, #{}}])),
    ?assertEqual({error, value_too_large}, couch_workers:job_add_many(T, [{<<"a">>, #{}, #{}}, {<<"id">>, Edge, #{}}])),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"a">>)),
    assert_nothing_written(T),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"v">> => 1}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    [?assertEqual({error, value_too_large}, couch_workers:job_update(Job, I)) || I <- [Huge, HugeList, Edge]],
    [?assertEqual({error, value_too_large}, couch_workers:job_finish(Job, I)) || I <- [Huge, HugeList, Edge]],
    ?assertMatch({ok, #{state := running, info := #{<<"v">> := 1}}}, couch_workers:job_get(T, <<"j1">>)),
    %% A big but legal info is stored: one that leaves room to run for the
    %% longest worker id the key limit allows (about 10,000 bytes).
    Legal = #{<<"blob">> => binary:copy(<<"v">>, ?VALUE_LIMIT - 11000)},
    ?assertMatch({ok, #{info := Legal}}, couch_workers:job_update(Job, Legal)),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ok = couch_workers:worker_unregister(W).

subscribe_bad_arguments(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    [
        ?assertError(badarg, couch_workers:job_subscribe(T, <<"j1">>, Bad))
     || Bad <- [self, make_ref(), "<0.1.0>", undefined, nil]
    ],
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ok = couch_workers:job_remove(T, <<"j1">>).

unknown_refs(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual({error, not_found}, couch_workers:job_accept(make_ref(), #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(make_ref(), #{timeout => 100})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(not_a_ref, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(<<"w1">>, #{})),
    %% A stale ref (unregistered).
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:worker_unregister(W),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ?assertEqual(ok, couch_workers:job_unsubscribe(make_ref())),
    ?assertEqual(ok, couch_workers:job_unsubscribe(42)),
    ?assertMatch({ok, #{state := pending, attempts := 0}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:job_remove(T, <<"j1">>).

nif_shape_checks(#{type := T}) ->
    R = make_ref(),
    Job = #{type => T, id => <<"j">>, worker => <<"w">>, token => <<0:128>>},
    %% The reference must be a reference; every shape is checked.
    ?assertError(badarg, couch_workers_nif:job_add(not_ref, T, <<"j">>, #{}, ?OPTS(0))),
    ?assertError(badarg, couch_workers_nif:job_add(R, T, <<"j">>, #{}, 1.0)),
    ?assertError(badarg, couch_workers_nif:job_add(R, T, <<"j">>, [], ?OPTS(0))),
    ?assertError(badarg, couch_workers_nif:job_add_many(R, T, [{<<"j">>, #{}, {1.0, undefined, undefined, undefined}}])),
    ?assertError(badarg, couch_workers_nif:job_add_many(R, T, [{<<"j">>, #{}}])),
    ?assertError(badarg, couch_workers_nif:job_accept(R, T, <<"w">>, -1)),
    ?assertError(badarg, couch_workers_nif:job_accept(R, T, <<"w">>, 1 bsl 64)),
    ?assertError(badarg, couch_workers_nif:job_accept(R, T, w, 0)),
    ?assertError(badarg, couch_workers_nif:job_accept_abandon(make_ref())),
    ?assertError(badarg, couch_workers_nif:job_update(R, maps:remove(token, Job), #{})),
    ?assertError(badarg, couch_workers_nif:job_finish(R, Job, not_map)),
    ?assertError(badarg, couch_workers_nif:job_cancel(R, T, 1)),
    ?assertError(badarg, couch_workers_nif:job_remove(R, 1, <<"j">>)),
    ?assertError(badarg, couch_workers_nif:job_get(not_ref, T, <<"j">>)),
    ?assertError(badarg, couch_workers_nif:job_pending_count(R, "t")),
    ?assertError(badarg, couch_workers_nif:job_subscribe(R, T, <<"j">>, self(), not_ref)),
    ?assertError(badarg, couch_workers_nif:job_subscribe(R, T, <<"j">>, not_pid, make_ref())),
    ?assertError(badarg, couch_workers_nif:job_unsubscribe(make_ref())),
    %% No answer was ever sent for R.
    ?assertEqual({error, timeout}, couch_workers_nif:wait(R, 100)),
    %% Value errors answer at once, with nothing sent later.
    ?assertEqual({error, invalid_priority}, couch_workers_nif:job_add(R, T, <<"j">>, #{}, ?OPTS(1 bsl 63))),
    ?assertEqual({error, invalid_info}, couch_workers_nif:job_add(R, T, <<"j">>, #{t => {}}, ?OPTS(0))),
    ?assertEqual({error, timeout}, couch_workers_nif:wait(R, 100)),
    assert_nothing_written(T).

%% A map with more terms than a normal scheduler may convert (5,000
%% integers; the budget is 2,000): the NIF answers `dirty' having done
%% nothing, and its DirtyCpu twin answers as the NIF does for a small map.
%% An error within the budget is answered on the normal scheduler.
big_terms_take_the_dirty_twins(#{type := T}) ->
    R = make_ref(),
    Big = #{<<"l">> => lists:seq(1, 5000)},
    BadLate = #{<<"l">> => lists:seq(1, 5000) ++ [{}]},
    BadEarly = #{<<"l">> => [{} | lists:seq(1, 5000)]},
    LongBin = #{<<"b">> => binary:copy(<<"b">>, 50000)},
    Job = #{type => T, id => <<"j">>, worker => <<"w">>, token => <<0:128>>},
    ?assertEqual(dirty, couch_workers_nif:job_add(R, T, <<"j">>, Big, ?OPTS(0))),
    ?assertEqual(dirty, couch_workers_nif:job_add(R, T, <<"j">>, LongBin, ?OPTS(0))),
    ?assertEqual(dirty, couch_workers_nif:job_add(R, T, <<"j">>, BadLate, ?OPTS(0))),
    ?assertEqual(dirty, couch_workers_nif:job_update(R, Job, Big)),
    ?assertEqual(dirty, couch_workers_nif:job_finish(R, Job, Big)),
    ?assertEqual(dirty, couch_workers_nif:worker_register(R, T, <<"w">>, Big)),
    ?assertEqual({error, invalid_info}, couch_workers_nif:job_add(R, T, <<"j">>, BadEarly, ?OPTS(0))),
    ?assertEqual({error, invalid_info}, couch_workers_nif:job_add_dirty(R, T, <<"j">>, BadLate, ?OPTS(0))),
    ?assertEqual({error, invalid_info}, couch_workers_nif:job_add_dirty(R, T, <<"j">>, BadEarly, ?OPTS(0))),
    %% Shapes first, on both.
    ?assertError(badarg, couch_workers_nif:job_add(not_ref, T, <<"j">>, Big, ?OPTS(0))),
    ?assertError(badarg, couch_workers_nif:job_add_dirty(not_ref, T, <<"j">>, Big, ?OPTS(0))),
    ?assertError(badarg, couch_workers_nif:job_update_dirty(R, maps:remove(token, Job), Big)),
    ?assertError(badarg, couch_workers_nif:job_finish_dirty(R, Job, not_map)),
    ?assertError(badarg, couch_workers_nif:worker_register_dirty(R, T, 1, Big)),
    ?assertError(badarg, couch_workers_nif:budgeted(job_add, [R, T, 1, Big, ?OPTS(0)])),
    %% Value errors, through budgeted/2 (as couch_workers calls them).
    ?assertEqual({error, invalid_priority}, couch_workers_nif:budgeted(job_add, [R, T, <<"j">>, Big, ?OPTS(1 bsl 63)])),
    ?assertEqual({error, invalid_info}, couch_workers_nif:budgeted(job_add, [R, T, <<"j">>, BadLate, ?OPTS(0)])),
    ?assertEqual({error, invalid_result}, couch_workers_nif:budgeted(job_finish, [R, Job, BadLate])),
    ?assertEqual({error, invalid_options}, couch_workers_nif:budgeted(worker_register, [R, T, <<"w">>, BadLate])),
    ?assertEqual(
        {error, invalid_timeout},
        couch_workers_nif:budgeted(worker_register, [R, T, <<"w">>, Big#{timeout => 0}])
    ),
    TooLarge = #{<<"l">> => lists:duplicate(60000, 0)},
    ?assertEqual(dirty, couch_workers_nif:job_add(R, T, <<"j">>, TooLarge, ?OPTS(0))),
    ?assertEqual({error, value_too_large}, couch_workers_nif:job_add_dirty(R, T, <<"j">>, TooLarge, ?OPTS(0))),
    ?assertEqual({error, value_too_large}, couch_workers:job_add(T, <<"j">>, TooLarge, #{})),
    %% Nothing was sent for R, nothing written.
    ?assertEqual({error, timeout}, couch_workers_nif:wait(R, 100)),
    assert_nothing_written(T),
    %% And the twins do the work: add, update, finish, register.
    T2 = <<T/binary, "_big">>,
    W = register_worker(T2, <<"w1">>, Big),
    ok = couch_workers:job_add(T2, <<"id">>, Big, #{}),
    {ok, #{info := Big} = H} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, invalid_info}, couch_workers:job_update(H, BadLate)),
    {ok, H1} = couch_workers:job_update(H, LongBin),
    ?assertEqual({error, invalid_result}, couch_workers:job_finish(H1, BadLate)),
    ok = couch_workers:job_finish(H1, Big),
    ?assertMatch({ok, #{state := finished, info := LongBin, result := Big}}, couch_workers:job_get(T2, <<"id">>)),
    ok = couch_workers:job_remove(T2, <<"id">>),
    ok = couch_workers:worker_unregister(W).

nothing_written_and_app_running(#{type := T}) ->
    %% Every kind of bad input once more, then the store and the app.
    catch couch_workers:job_add(T, 1, #{}, #{}),
    _ = couch_workers:job_add(T, <<"id">>, #{p => self()}, #{}),
    _ = couch_workers:job_add(T, <<"id">>, #{}, #{priority => 1.0}),
    _ = couch_workers:job_add(T, binary:copy(<<"k">>, ?KEY_LIMIT + 1), #{}, #{}),
    _ = couch_workers:job_add(T, <<"id">>, #{<<"b">> => binary:copy(<<"v">>, ?VALUE_LIMIT + 1)}, #{}),
    catch couch_workers:job_add_many(T, [bogus]),
    _ = couch_workers:job_add_many(T, [{<<"id">>, #{t => {}}, #{}}]),
    catch couch_workers:job_update(#{}, #{}),
    catch couch_workers:job_finish(#{}, #{}),
    assert_nothing_written(T),
    #{running := true} = couch_workers:stats(),
    [?assert(is_pid(whereis(S))) || S <- [couch_workers_jobs_subs, couch_workers_local, couch_workers_global]],
    %% And it works.
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"id">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(Job, #{}),
    ok = couch_workers:job_remove(T, <<"id">>),
    ok = couch_workers:worker_unregister(W).

%% ---- helpers ---------------------------------------------------------------

deep(0) -> #{};
deep(N) -> #{d => deep(N - 1)}.
