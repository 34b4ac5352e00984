%% @doc Maps of more than 128 keys built off the schedulers (found by
%% the scheduler tests' workload): a job info, a worker's options, or a
%% membership of more than 128 workers.
%%
%% The NIF builds its replies and deliveries in process-independent
%% environments on the Rust runtime's threads. On this machine's OTP
%% (25.2.3, erts 13.1.5) `enif_make_map_from_arrays' there segfaults the
%% whole VM for more than 128 keys, while `enif_make_map_put' does not
%% (shown with a 30-line C NIF, up to 60,000 keys). Each case here runs on
%% a peer node, so that a crash shows as a failed test (the peer died)
%% instead of taking the EUnit VM down with it.
-module(couch_workers_bigmap_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

%% Run on the peer (through peer:call/4).
-export([peer_job_info/2, peer_membership/2, peer_worker_options/2]).

-define(PEER_TIMEOUT, 30000).

bigmap_test_() ->
    couch_workers_test_util:peer_fixture(
        "maps of more than 128 keys, built off the schedulers, do not crash the VM",
        "bigmap",
        [
            ?TDEF_FE(job_info_of_200_and_7000_keys, 60),
            ?TDEF_FE(membership_of_129_and_300_workers, 60),
            ?TDEF_FE(worker_options_of_300_keys, 60)
        ]
    ).

%% ---- tests -------------------------------------------------------------------

job_info_of_200_and_7000_keys(#{type := T} = Ctx) ->
    [?assertEqual({ok, N}, on_peer(Ctx, peer_job_info, [T, N])) || N <- [129, 200, 7000]],
    alive(Ctx).

membership_of_129_and_300_workers(#{type := T} = Ctx) ->
    [?assertEqual({ok, N}, on_peer(Ctx, peer_membership, [<<T/binary, "_", (integer_to_binary(N))/binary>>, N])) || N <- [129, 300]],
    alive(Ctx).

worker_options_of_300_keys(#{type := T} = Ctx) ->
    ?assertEqual({ok, 300}, on_peer(Ctx, peer_worker_options, [T, 300])),
    alive(Ctx).

%% A call on the peer; `{peer_died, ...}' if the peer went away meanwhile.
on_peer(#{peer := Peer, os_pid := OsPid}, F, Args) ->
    try
        peer:call(Peer, ?MODULE, F, Args, ?PEER_TIMEOUT)
    catch
        Class:Reason ->
            {peer_died, Class, Reason, {os_process_alive, couch_workers_test_util:os_pid_alive(OsPid)}}
    end.

%% The peer's OS process lives, and its app answers.
alive(#{peer := Peer, os_pid := OsPid}) ->
    ?assert(couch_workers_test_util:os_pid_alive(OsPid)),
    ?assertMatch(#{running := true}, peer:call(Peer, couch_workers, stats, [], ?PEER_TIMEOUT)).

%% ---- run on the peer -------------------------------------------------------------

%% A job whose info has N keys: get, accept (a handle), a subscription
%% message; returns {ok, N} when every one of them had all N keys.
peer_job_info(Type0, N) ->
    Type = <<Type0/binary, "_", (integer_to_binary(N))/binary>>,
    Info = maps:from_list([{integer_to_binary(I), I} || I <- lists:seq(1, N)]),
    ok = couch_workers:job_add(Type, <<"j">>, Info, #{}),
    {ok, #{info := Got}} = couch_workers:job_get(Type, <<"j">>),
    {ok, Sub, #{info := Sub0}} = couch_workers:job_subscribe(Type, <<"j">>, self()),
    W = couch_workers:worker_register(Type, <<"w">>, #{}, self()),
    {ok, #{info := Accepted} = H} = couch_workers:job_accept(W, #{}),
    Msg =
        receive
            {couch_workers_job, Sub, #{state := running, info := I}} -> I
        after 5000 -> timeout
        end,
    %% A result as big (a record holds info and result: both must fit
    %% the value limit, so 7,000 keys only once; 8,000, 94 KB of JSON,
    %% no longer leave a job room to run: docs/api.md, "Limits").
    ResultIn =
        case N > 1000 of
            true -> #{<<"n">> => N};
            false -> Info
        end,
    ok = couch_workers:job_finish(H, ResultIn),
    {ok, #{result := ResultIn}} = couch_workers:job_get(Type, <<"j">>),
    ok = couch_workers:job_unsubscribe(Sub),
    ok = couch_workers:worker_unregister(W),
    ok = couch_workers:job_remove(Type, <<"j">>),
    case lists:usort([Got, Sub0, Accepted, Msg]) of
        [Info] -> {ok, N};
        Other -> {error, [map_size(M) || M <- Other, is_map(M)]}
    end.

%% N workers of one type and a subscriber of the type on this node: the
%% membership delivered (a map of N workers) and cached.
peer_membership(Type, N) ->
    Sub = couch_workers:membership_subscribe(Type, nil, self()),
    Refs = [couch_workers:worker_register(Type, integer_to_binary(I), #{}, self()) || I <- lists:seq(1, N)],
    Got = wait_members(Type, N, erlang:monotonic_time(millisecond) + 10000),
    [ok = couch_workers:worker_unregister(R) || R <- Refs],
    ok = couch_workers:membership_unsubscribe(Sub),
    Got.

%% A worker whose options have N keys, seen in the membership.
peer_worker_options(Type0, N) ->
    Type = <<Type0/binary, "_opts">>,
    Opts = maps:from_list([{integer_to_binary(I), I} || I <- lists:seq(1, N)]),
    Sub = couch_workers:membership_subscribe(Type, nil, self()),
    R = couch_workers:worker_register(Type, <<"w">>, Opts, self()),
    Got = wait_options(Type, Opts, erlang:monotonic_time(millisecond) + 10000),
    ok = couch_workers:worker_unregister(R),
    ok = couch_workers:membership_unsubscribe(Sub),
    case Got of
        ok -> {ok, N};
        Error -> Error
    end.

wait_members(Type, N, Deadline) ->
    case couch_workers:get_workers(Type) of
        {ok, _, W} when map_size(W) =:= N ->
            {ok, N};
        Other ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true ->
                    {error, {members, element(1, Other)}};
                false ->
                    timer:sleep(10),
                    wait_members(Type, N, Deadline)
            end
    end.

wait_options(Type, Opts, Deadline) ->
    case couch_workers:get_workers(Type) of
        {ok, _, #{<<"w">> := Opts}} ->
            ok;
        _ ->
            case erlang:monotonic_time(millisecond) > Deadline of
                true ->
                    {error, no_delivery};
                false ->
                    timer:sleep(10),
                    wait_options(Type, Opts, Deadline)
            end
    end.
