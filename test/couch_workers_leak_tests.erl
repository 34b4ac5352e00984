%% @doc Resources do not leak (the Erlang side).
%%
%% Cycles of every call that creates something live, then the live counts
%% of `couch_workers:stats()' must be back at their starting values (after
%% GC-ing the servers, whose heaps hold dropped NIF handles until then):
%% heartbeat tasks, membership watchers, registrations and watches (NIF
%% handles), job dispatchers, waiters, watchers, subscriptions and accept
%% waiters. The node-local tables (registrations, the membership cache),
%% the servers' state, the process count and the VM's memory are measured
%% too; memory is printed, and only a generous bound is asserted.
%%
%% COUCH_WORKERS_LEAK_CYCLES sets the cycles of each kind (default 10,000;
%% the issue's figure is 100,000):
%%
%% * register + unregister, each with a new worker id (and one in ten by
%%   the owner's exit instead);
%% * membership subscribe + unsubscribe (a new type every 100 cycles, so
%%   watchers start and stop; one in ten with a callback module, which has
%%   its own process);
%% * job subscribe + unsubscribe, and accepts (timeout 0, and one in a
%%   hundred waiting 1 ms in a dispatcher).
-module(couch_workers_leak_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

-define(MB, (1024 * 1024)).
%% The BEAM's memory may grow by at most this much (generous: code
%% loading, ETS and atom tables, allocator caches).
-define(MEMORY_BOUND, (64 * ?MB)).

leak_test_() ->
    couch_workers_test_util:app_fixture("no leak after many register/unregister and subscribe/unsubscribe cycles", fun setup/0, fun teardown/1, [
        ?TDEF_FE(register_unregister_cycles, 300),
        ?TDEF_FE(membership_subscribe_cycles, 300),
        ?TDEF_FE(job_subscribe_and_accept_cycles, 300)
    ]).

setup() ->
    #{type => unique_type("leak"), cycles => couch_workers_test_util:env_int("COUCH_WORKERS_LEAK_CYCLES", 10000)}.

teardown(_) ->
    ok.

%% ---- tests -------------------------------------------------------------------

register_unregister_cycles(#{type := T, cycles := N}) ->
    Before = snapshot(),
    S = couch_workers:membership_subscribe(T, nil, self()),
    lists:foreach(
        fun(I) ->
            Id = integer_to_binary(I),
            case I rem 10 of
                0 ->
                    %% The owner's exit unregisters it.
                    {Pid, Mon} = spawn_monitor(fun() ->
                        Ref = couch_workers:worker_register(T, Id, #{timeout => 60}, self()),
                        true = is_reference(Ref)
                    end),
                    receive
                        {'DOWN', Mon, process, Pid, normal} -> ok
                    end;
                _ ->
                    Ref = couch_workers:worker_register(T, Id, #{timeout => 60}, self()),
                    true = is_reference(Ref),
                    ok = couch_workers:worker_unregister(Ref)
            end,
            flush_membership()
        end,
        lists:seq(1, N)
    ),
    %% The owners' exits were written too: the membership is empty.
    wait_for(fun() -> element(3, couch_workers:get_workers(T)) =:= #{} end, 10000),
    ok = couch_workers:membership_unsubscribe(S),
    flush_membership(),
    check_back(io_lib:format("~b register/unregister cycles (~b by owner exit)", [N, N div 10]), Before).

membership_subscribe_cycles(#{type := T, cycles := N}) ->
    %% A worker, so that every first delivery carries a member.
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    Before = snapshot(),
    lists:foreach(
        fun(I) ->
            Type =
                case I rem 2 of
                    0 -> T;
                    1 -> <<T/binary, "_", (integer_to_binary(I div 100))/binary>>
                end,
            Module =
                case I rem 10 of
                    0 -> couch_workers_test_cb;
                    _ -> nil
                end,
            Ref = couch_workers:membership_subscribe(Type, Module, self()),
            true = is_reference(Ref),
            ok = couch_workers:membership_unsubscribe(Ref)
        end,
        lists:seq(1, N)
    ),
    flush_membership(),
    check_back(io_lib:format("~b membership subscribe/unsubscribe cycles (~b types)", [N, N div 100 + 1]), Before),
    ok = couch_workers:worker_unregister(W).

job_subscribe_and_accept_cycles(#{type := T, cycles := N}) ->
    %% The subscribed job is of another type than the worker's, which has
    %% no job: every accept is `not_found' (after a waiter, and for the
    %% 1 ms ones a dispatcher, were made and dropped).
    TJ = <<T/binary, "_jobs">>,
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    ok = couch_workers:job_add(TJ, <<"j">>, #{}, #{}),
    Before = snapshot(),
    lists:foreach(
        fun(I) ->
            {ok, Ref, #{state := pending}} = couch_workers:job_subscribe(TJ, <<"j">>, self()),
            ok = couch_workers:job_unsubscribe(Ref),
            Timeout =
                case I rem 100 of
                    0 -> 1;
                    _ -> 0
                end,
            {error, not_found} = couch_workers:job_accept(W, #{timeout => Timeout})
        end,
        lists:seq(1, N)
    ),
    check_back(io_lib:format("~b job subscribe/unsubscribe + accept cycles (~b waiting 1 ms)", [N, N div 100]), Before),
    ok = couch_workers:job_remove(TJ, <<"j">>),
    ok = couch_workers:worker_unregister(W).

%% ---- measuring -------------------------------------------------------------------

snapshot() ->
    settle_gc(),
    #{
        counts => couch_workers_test_util:counts(),
        tables => tables(),
        processes => erlang:system_info(process_count),
        memory => erlang:memory(total),
        rss => rss(),
        t0 => erlang:monotonic_time(millisecond)
    }.

check_back(What, #{counts := C0, tables := Tab0, processes := P0, memory := M0, rss := R0, t0 := T0}) ->
    Ms = erlang:monotonic_time(millisecond) - T0,
    %% Stopped tasks and dropped handles go asynchronously: wait (GC-ing
    %% the servers) until the counts are back.
    Settled =
        try
            wait_for(fun() -> couch_workers_test_util:counts() =:= C0 andalso tables() =:= Tab0 end, 10000),
            true
        catch
            error:{wait_for_timeout, _} -> false
        end,
    settle_gc(),
    C1 = couch_workers_test_util:counts(),
    Tab1 = tables(),
    P1 = erlang:system_info(process_count),
    M1 = erlang:memory(total),
    R1 = rss(),
    io:format(
        standard_error,
        "~n    ~s in ~b ms~n"
        "      counts before: ~w~n"
        "      counts after:  ~w~n"
        "      tables (rows) before/after: ~w / ~w; processes before/after: ~b / ~b~n"
        "      erlang:memory(total) before/after: ~.1f / ~.1f MB (~s MB); OS RSS before/after: ~s / ~s MB~n",
        [What, Ms, C0, C1, Tab0, Tab1, P0, P1, M0 / ?MB, M1 / ?MB, signed_mb(M1 - M0), mb(R0), mb(R1)]
    ),
    ?assert(Settled),
    ?assertEqual(C0, C1),
    ?assertEqual(Tab0, Tab1),
    %% Processes: only what GC and the test may have started on the side.
    ?assert(P1 =< P0 + 5),
    ?assert(M1 - M0 < ?MEMORY_BOUND).

tables() ->
    [{Tab, ets:info(Tab, size)} || Tab <- [couch_workers_local, couch_workers_membership, couch_workers_membership_subs, couch_workers_jobs_subs]] ++
        [{Server, state_size(Server)} || Server <- [couch_workers_local, couch_workers_global, couch_workers_jobs_subs]].

%% The servers' state, flattened: its size must come back too (a map that
%% only grows would show here).
state_size(Server) ->
    erts_debug:flat_size(sys:get_state(Server)).

settle_gc() ->
    [erlang:garbage_collect(P) || P <- processes()],
    ok.

rss() ->
    case file:read_file("/proc/self/status") of
        {ok, Status} ->
            case re:run(Status, "VmRSS:\\s+(\\d+) kB", [{capture, all_but_first, list}]) of
                {match, [Kb]} -> list_to_integer(Kb) * 1024;
                nomatch -> undefined
            end;
        {error, _} ->
            undefined
    end.

signed_mb(D) when D >= 0 -> io_lib:format("+~.1f", [D / ?MB]);
signed_mb(D) -> io_lib:format("~.1f", [D / ?MB]).

mb(undefined) -> "?";
mb(Bytes) -> io_lib:format("~.1f", [Bytes / ?MB]).

flush_membership() ->
    receive
        {couch_workers_membership, _, _, _, _} -> flush_membership()
    after 0 -> ok
    end.
