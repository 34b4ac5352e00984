%% @doc The wait for a NIF's answer counts only time the VM could run.
%%
%% A real `erl' peer waits (`couch_workers_nif:wait/2', 2 s) for an answer
%% that another process of the peer sends only once it has seen the VM
%% stopped and running again (plus 200 ms, as a NIF's answer comes a
%% moment after the thaw). The peer is stopped with SIGSTOP for 4 s, twice
%% the wait. Before, the waiter's timer fired on the thaw and it answered
%% `timeout' for an answer that was on its way: on a write, an error for a
%% commit that may have landed.
-module(couch_workers_nif_wait_tests).

-include_lib("eunit/include/eunit.hrl").

%% Run on the peer.
-export([wait_across_a_stop/1, answer_after_a_stop/2]).

-define(WAIT_MS, 2000).

wait_test_() ->
    %% A peer's boot alone can take tens of seconds on a loaded machine
    %% (60 s ran out once at load 6-8 on 2 cores).
    {timeout, 120, [
        {"an answer that comes after the VM was stopped longer than the wait is still taken",
            fun an_answer_after_a_stop_is_taken/0},
        {"a wait the VM could run through ends with timeout", fun a_wait_with_no_answer_times_out/0}
    ]}.

an_answer_after_a_stop_is_taken() ->
    #{peer := Peer, os_pid := OsPid} = start_peer(),
    try
        Self = self(),
        {Caller, Mon} = spawn_monitor(fun() ->
            Self ! {waited, catch peer:call(Peer, ?MODULE, wait_across_a_stop, [200], 30000)}
        end),
        timer:sleep(300),
        try
            "" = os:cmd("kill -STOP " ++ OsPid),
            timer:sleep(2 * ?WAIT_MS)
        after
            %% Whatever happened: a stopped peer would never stop.
            os:cmd("kill -CONT " ++ OsPid)
        end,
        receive
            {waited, Result} -> ?assertEqual({answered, after_the_stop}, Result)
        after 20000 -> error({no_answer_from, Caller})
        end,
        erlang:demonitor(Mon, [flush])
    after
        peer:stop(Peer)
    end.

a_wait_with_no_answer_times_out() ->
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual({error, timeout}, couch_workers_nif:wait(make_ref(), 600)),
    Took = erlang:monotonic_time(millisecond) - T0,
    ?assert(Took >= 600),
    ?assert(Took < 600 + 1000).

%% ---- on the peer -------------------------------------------------------------

-spec wait_across_a_stop(non_neg_integer()) -> term().
wait_across_a_stop(DelayMs) ->
    Ref = make_ref(),
    Self = self(),
    spawn(fun() -> answer_after_a_stop(Self, {Ref, DelayMs}) end),
    case couch_workers_nif:wait(Ref, ?WAIT_MS) of
        {error, timeout} -> {error, timeout};
        Answer -> {answered, Answer}
    end.

%% Ticks every 50 ms; a tick that comes over a second late saw the stop.
-spec answer_after_a_stop(pid(), {reference(), non_neg_integer()}) -> ok.
answer_after_a_stop(To, {Ref, DelayMs}) ->
    tick(To, Ref, DelayMs, erlang:monotonic_time(millisecond)).

tick(To, Ref, DelayMs, Last) ->
    timer:sleep(50),
    Now = erlang:monotonic_time(millisecond),
    case Now - Last > 1000 of
        true ->
            timer:sleep(DelayMs),
            To ! {Ref, after_the_stop},
            ok;
        false ->
            tick(To, Ref, DelayMs, Now)
    end.

start_peer() ->
    Erl = os:find_executable("erl"),
    OtpLib = code:lib_dir(),
    Paths = [P || P <- code:get_path(), not lists:prefix(OtpLib, P), P =/= "."],
    {ok, Peer, _Node} = peer:start(#{
        exec => Erl,
        connection => standard_io,
        args => lists:append([["-pa", P] || P <- Paths]),
        wait_boot => 30000
    }),
    OsPid = peer:call(Peer, os, getpid, [], 15000),
    #{peer => Peer, os_pid => OsPid}.
