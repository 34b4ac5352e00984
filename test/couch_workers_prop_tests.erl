%% @doc Random operations against a model: PropEr
%% stateful tests of the whole public API.
%%
%% Each sequence draws calls of register, unregister, owner exits (kill
%% and normal), membership subscribe/unsubscribe, job add/add_many,
%% accept (timeout 0), update, finish, fail (no retry, or retried at
%% once), release, resubmit (with priority and max_attempts, in every
%% state), cancel, remove, and bad inputs of
%% every kind (wrong types, maps JSON cannot hold, unknown and stale
%% references, forged and cross-type handles, keys and values over the
%% limits), and checks after every call, against a simple model:
%%
%% * the call's result is the model's;
%% * every job of the sequence's types and ids (`job_get' of each) is in
%%   exactly the model's state, with its worker, priority, info, result,
%%   error, attempts, max_attempts and cancel request; every other id is
%%   `not_found';
%% * the pending count and `job_counts/1' of each type are the model's;
%% * no running job (as `job_get' says) without a live registered owner:
%%   its worker is registered on this node (the registration table) and
%%   the owner process is alive;
%% * the membership: for a type with a subscription, `get_workers/1'
%%   settles to exactly the registered set with its options; without one
%%   it is `not_found';
%% * the app runs, with the same server processes as at the start (no
%%   crash and restart hides anywhere).
%%
%% The model is exact because every call is deterministic: accepts use
%% timeout 0; an unregister returns after its write (the contract:
%% "every call that returns has finished its write"); after an owner exits, the
%% harness waits for its `DOWN', then until `couch_workers_local' has
%% taken each of its workers out (its own `DOWN' came: the exit is a
%% death, which fails the running jobs, where an unregister releases
%% them), and then calls `worker_unregister/1' on their references, which
%% returns once the removal the exit started has been written
%% (`couch_workers_local' answers it from its `unregistering' table).
%% Failover order is the store's: a removed
%% worker's jobs go back to pending in active-key order (job id byte
%% order) behind every job already pending of their priority. An owner
%% exit of several workers that run jobs would requeue them in an order
%% the model cannot know (the order of the monitors' `DOWN's), so an
%% owner exit is drawn only while at most one of its workers runs jobs.
%%
%% Types and ids look like one another and like the key space's names:
%% types `P', `P\0' and `P\0pending' (a fresh `P' per sequence), job ids
%% `j1', `j2', `j1\0', `', `\0', `jobs', worker ids `w1', `w2', `w1\0', `'.
%%
%% This module is the property and PropEr's callbacks; the model's
%% transitions and expected answers are `couch_workers_prop_model', the
%% commands (the API calls and the harness's state) `couch_workers_prop_cmds',
%% the checks of the world `couch_workers_prop_world'; what they share
%% (the values drawn, the records) `couch_workers_prop.hrl'.
%%
%% PropEr is used without its header (Debian's `erlang-proper' ships no
%% `proper.hrl'; that is in `erlang-proper-dev'): `?FORALL' is
%% `proper:forall/2' and so on, written out.
%%
%% EUnit runs COUCH_WORKERS_PROPER_NUMTESTS sequences (default 250) of
%% 0 to 50 calls (25 on average); `scripts/proper_long.sh' runs about
%% 10^5 calls.
-module(couch_workers_prop_tests).

-include_lib("eunit/include/eunit.hrl").

-behaviour(proper_statem).

-export([initial_state/0, command/1, precondition/2, postcondition/3, next_state/3]).
%% For scripts/proper_long.sh.
-export([run/2, prop_model/0]).

-include("couch_workers_prop.hrl").

-define(STATS_TAB, couch_workers_prop_stats).
%% The module whose functions are the commands.
-define(CMDS, couch_workers_prop_cmds).

-define(BAD, [
    add_type_not_binary,
    add_id_not_binary,
    add_info_not_map,
    add_opts_not_map,
    add_info_pid,
    add_info_tuple,
    add_info_dup_key,
    add_info_bad_utf8,
    add_info_too_deep,
    add_priority_float,
    add_priority_too_big,
    add_id_too_large,
    add_type_too_large,
    add_info_too_large,
    add_many_bogus,
    add_many_not_list,
    add_many_not_json,
    add_many_too_large,
    add_many_id_too_large,
    register_bad_timeout,
    register_not_json,
    register_type_not_binary,
    register_not_pid,
    register_id_too_large,
    register_opts_too_large,
    unregister_unknown,
    unregister_not_ref,
    unregister_stale,
    subscribe_not_binary,
    subscribe_not_pid,
    subscribe_type_too_large,
    unsubscribe_unknown,
    get_workers_not_binary,
    accept_unknown_ref,
    accept_stale_ref,
    accept_not_ref,
    accept_bad_timeout,
    accept_opts_not_map,
    update_not_handle,
    update_info_not_json,
    update_info_too_large,
    finish_result_not_map,
    finish_result_not_json,
    finish_result_too_large,
    forged_update,
    forged_finish,
    cross_type_update,
    cross_type_finish,
    other_worker_finish,
    cancel_id_not_binary,
    cancel_unknown,
    remove_id_too_large,
    remove_unknown,
    get_id_too_large,
    get_unknown,
    count_not_binary,
    count_type_too_large,
    job_subscribe_unknown,
    job_subscribe_not_pid,
    job_unsubscribe_unknown
]).

initial_state() ->
    #m{}.

command(M) ->
    Registered = maps:keys(M#m.workers),
    AnyWorker = {proper_types:oneof(?TYPES), proper_types:oneof(?WORKER_IDS)},
    Subscribed = maps:keys(M#m.subs),
    Handles = [N || {N, _} <- M#m.handles],
    Type = proper_types:oneof(?TYPES),
    Id = proper_types:oneof(?JOB_IDS),
    Info = proper_types:choose(0, ?N_INFOS - 1),
    Prio = proper_types:oneof(?PRIORITIES),
    Exitable = [O || O <- ?OWNERS, couch_workers_prop_model:exitable(M, O)],
    proper_types:frequency(
        [
            {4, {call, ?CMDS, register, [Type, proper_types:oneof(?WORKER_IDS), proper_types:oneof(?OWNERS), proper_types:choose(1, 3)]}},
            {1, {call, ?CMDS, unregister, [AnyWorker]}},
            {1, {call, ?CMDS, subscribe, [Type]}},
            {6, {call, ?CMDS, add, [Type, Id, Info, Prio]}},
            {2, {call, ?CMDS, add_many, [Type, proper_types:resize(4, proper_types:list({Id, Info, Prio}))]}},
            {2, {call, ?CMDS, accept, [AnyWorker]}},
            {2, {call, ?CMDS, cancel, [Type, Id]}},
            {2, {call, ?CMDS, remove, [Type, Id]}},
            {3, {call, ?CMDS, resubmit, [Type, Id, Info, Prio, proper_types:oneof([1, 2, 20])]}},
            {4, {call, ?CMDS, bad, [proper_types:oneof(?BAD), Type, proper_types:oneof([0 | Handles])]}}
        ] ++
            [{3, {call, ?CMDS, unregister, [proper_types:oneof(Registered)]}} || Registered =/= []] ++
            [{8, {call, ?CMDS, accept, [proper_types:oneof(Registered)]}} || Registered =/= []] ++
            [{1, {call, ?CMDS, owner_exit, [proper_types:oneof(Exitable), proper_types:oneof([kill, normal])]}} || Exitable =/= []] ++
            [{1, {call, ?CMDS, unsubscribe, [proper_types:oneof(Subscribed)]}} || Subscribed =/= []] ++
            [{5, {call, ?CMDS, update, [proper_types:oneof(Handles), Info]}} || Handles =/= []] ++
            [{5, {call, ?CMDS, finish, [proper_types:oneof(Handles), Info]}} || Handles =/= []] ++
            [{3, {call, ?CMDS, fail, [proper_types:oneof(Handles), Info, proper_types:oneof([false, 0])]}} || Handles =/= []] ++
            [{2, {call, ?CMDS, release, [proper_types:oneof(Handles)]}} || Handles =/= []]
    ).

precondition(M, {call, _, owner_exit, [O, _]}) ->
    couch_workers_prop_model:exitable(M, O);
precondition(M, {call, _, unsubscribe, [T]}) ->
    maps:is_key(T, M#m.subs);
precondition(M, {call, _, update, [N, _]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, finish, [N, _]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, fail, [N, _, _]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, release, [N]}) ->
    lists:keymember(N, 1, M#m.handles);
precondition(M, {call, _, bad, [_, _, N]}) ->
    N =:= 0 orelse lists:keymember(N, 1, M#m.handles);
precondition(_M, _Call) ->
    true.

next_state(M, Res, Call) ->
    couch_workers_prop_model:next_state(M, Res, Call).

%% ---- postconditions: the result, then the whole world ---------------------------

postcondition(M, Call, Res) ->
    case couch_workers_prop_model:expected(M, Call, Res) of
        true ->
            try
                couch_workers_prop_world:check_world(next_state(M, Res, Call)),
                true
            catch
                throw:{check_failed, What} ->
                    put(prop_failure, {world, What}),
                    false
            end;
        false ->
            put(prop_failure, {result, Call, Res}),
            false
    end.

%% ---- sequences -----------------------------------------------------------------------

start_sequence() ->
    put(prefix, iolist_to_binary(["prop", integer_to_list(erlang:unique_integer([positive]))])),
    put(stale, []),
    put(accepts, 0),
    put(servers, [whereis(S) || S <- ?SERVERS]),
    [put({owner, O}, ?CMDS:spawn_owner()) || O <- ?OWNERS],
    ok.

end_sequence() ->
    [ok = couch_workers:worker_unregister(Ref) || {{wref, _}, {Ref, _}} <- get()],
    [ok = couch_workers:membership_unsubscribe(Ref) || {{subs, _}, Refs} <- get(), Ref <- Refs],
    [exit(Pid, kill) || {{owner, _}, Pid} <- get()],
    couch_workers_prop_world:flush_membership(),
    %% Only the harness's keys: PropEr keeps its own state in the
    %% process dictionary too.
    [erase(K) || {K, _} <- get(), harness_key(K)],
    ok.

harness_key({wref, _}) -> true;
harness_key({owner, _}) -> true;
harness_key({handle, _}) -> true;
harness_key({subs, _}) -> true;
harness_key(K) -> lists:member(K, [prefix, stale, accepts, servers, prop_failure]).

prop_model() ->
    proper:forall(
        proper_statem:commands(?MODULE),
        fun(Cmds) ->
            start_sequence(),
            erase(prop_failure),
            {History, State, Result} = proper_statem:run_commands(?MODULE, Cmds),
            Failure = get(prop_failure),
            end_sequence(),
            count(sequences, 1),
            count(calls, length(History)),
            Executed = lists:sublist([call_name(C) || {set, _, C} <- Cmds], length(History)),
            [count({call, F}, 1) || F <- Executed],
            proper:whenfail(
                fun() ->
                    io:format(standard_error, "~nfailed: ~P~nfailure: ~P~nlast model: ~P~nresults (last 5): ~P~n", [
                        Result, 40, Failure, 40, State, 40, [R || {_, R} <- lists:sublist(lists:reverse(History), 5)], 40
                    ])
                end,
                fun() -> Result =:= ok end
            )
        end
    ).

call_name({call, _, bad, [Kind | _]}) -> {bad, Kind};
call_name({call, _, F, _}) -> F.

count(Key, N) ->
    ets:update_counter(?STATS_TAB, Key, N, {Key, 0}).

%% Runs NumTests sequences of 0..Size calls (uniformly: PropEr stops a
%% sequence with probability 1/(Size - Length + 1)); every test gets the
%% same size (resize/more_commands do not reach the sized generator of
%% commands in PropEr 1.2, so the size is set here); returns
%% {Passed, #{sequences, calls, per_command}}.
run(NumTests, Size) ->
    case ets:info(?STATS_TAB) of
        undefined -> ets:new(?STATS_TAB, [named_table, public, set]);
        _ -> ets:delete_all_objects(?STATS_TAB)
    end,
    T0 = erlang:monotonic_time(millisecond),
    Passed = proper:quickcheck(prop_model(), [{numtests, NumTests}, {start_size, Size}, {max_size, Size}, quiet, {max_shrinks, 200}]),
    Ms = erlang:monotonic_time(millisecond) - T0,
    Stats = maps:from_list(ets:tab2list(?STATS_TAB)),
    PerCommand = lists:sort([{F, C} || {{call, F}, C} <- maps:to_list(Stats)]),
    Figures = #{
        sequences => maps:get(sequences, Stats, 0),
        calls => maps:get(calls, Stats, 0),
        per_command => PerCommand,
        ms => Ms
    },
    case Passed of
        true -> ok;
        _ -> io:format(standard_error, "~ncounterexample: ~p~n", [proper:counterexample()])
    end,
    {Passed, Figures}.

%% ---- EUnit ---------------------------------------------------------------------------

prop_test_() ->
    {
        "PropEr: random API sequences checked against a model after every call",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(_) -> {timeout, 600, ?_test(run_ci())} end
        }
    }.

run_ci() ->
    NumTests = couch_workers_test_util:env_int("COUCH_WORKERS_PROPER_NUMTESTS", 250),
    Before = couch_workers_test_util:counts(),
    {Passed, #{sequences := S, calls := C, per_command := Per, ms := Ms}} = run(NumTests, 50),
    io:format(
        standard_error,
        "~n    PropEr: ~b sequences, ~b calls (avg ~.1f per sequence), ~b ms, passed: ~p~n    calls per command: ~p~n",
        [S, C, C / max(1, S), Ms, Passed, Per]
    ),
    ?assertEqual(true, Passed),
    ?assert(S >= NumTests),
    %% Every sequence cleaned up after itself: nothing of it is left.
    couch_workers_test_util:wait_for(fun() -> couch_workers_test_util:counts() =:= Before end, 5000).
