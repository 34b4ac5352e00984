%% @doc The workers registered on this node.
%%
%% Keeps the ETS table `couch_workers_local' (owned by the supervisor, see
%% `couch_workers_tables'):
%%
%% ```
%% {{Type, Id}, Ref}                              the registration of (Type, Id)
%% {Ref, Type, Id, Pid, Registration, MonRef}    Registration: the NIF resource
%% '''
%%
%% The resource keeps the worker registered (and heartbeating); when it is
%% garbage collected the Rust side removes the worker. An owner's exit
%% (its monitor's `DOWN', whatever the reason) removes the worker as a
%% death, which fails its running jobs with `worker_lost'; only
%% `unregister_worker/1' (and a clean stop of the app) releases them.
%%
%% The table outlives a crash of this server: the restarted server finds
%% every registration in it, monitors the owners again (an owner that died
%% meanwhile is removed at once, as a death) and points the registrations'
%% events at itself, so no registration is dropped and none leaks. A
%% request in flight when
%% the server crashed is lost with it: a registration its answer carried
%% is garbage, which removes that worker, and `register_worker/4' asks the
%% restarted server again; an unregister completes on the Rust side.
%%
%% A registration belongs to the node it was made on (`couch_workers_node'
%% owns the node; a new owner is a new node). A stop of this server
%% (`shutdown': the application stops, or `couch_workers_node_sup' restarts
%% the group after the node's owner died) unregisters every worker (their
%% running jobs are released) and then tells each owner
%% `{couch_workers_worker_lost, Ref, stopped}': `Ref' is over, and a
%% register makes a new registration. A restarted server that finds rows
%% of a node that is gone (this server had crashed, and the node was
%% restarted before it came back) tells their owners the same at once;
%% their workers, which nothing heartbeats any more, are reaped after
%% their timeout.
%%
%% Owners are told what only a heartbeat can find (`worker_notify/3' of
%% the NIF sends it to them directly): `{couch_workers_worker_reaped,
%% Ref}' when the worker was reaped while its owner lived (its node could
%% not write for longer than its timeout) and the heartbeat registered it
%% again, keeping `Ref'; `{couch_workers_worker_lost, Ref, superseded}'
%% when a later registration of the same `(Type, Id)', on another node,
%% replaced it. Then `Ref' is over: this server forgets it (told by
%% `{couch_workers_worker_superseded, Ref}'), so that a register of the
%% same key starts a new registration. `{couch_workers_worker_at_risk,
%% Ref, heartbeat_failing}' when the node's heartbeat service keeps
%% failing (restarted 5 times within a minute): the worker may be reaped.
%% `{couch_workers_job_timeout, Ref, JobType, JobId}' when this node's
%% activity observer took a running job of the worker back (its record
%% did not change for its `activity_timeout').
%%
%% The server never waits for the store: it calls the NIF with a fresh
%% reference, keeps the caller's `From', and answers with
%% `gen_server:reply/2' when `{NifRef, Result}' arrives. Operations on one
%% `(Type, Id)' are serialized: a second register while the first is in
%% flight waits for (and returns) the same `Ref'; a register while an
%% unregister of the same key is in flight starts after it, so that the
%% late removal can never delete the new registration.
-module(couch_workers_local).

-behaviour(gen_server).

-export([start_link/0, register_worker/4, unregister_worker/1, lookup/1, registration/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-define(TAB, couch_workers_local).
%% How long terminate waits for the unregistrations to be written.
-define(TERMINATE_WAIT_MS, 10000).

-type key() :: {binary(), binary()}.

-record(st, {
    %% NifRef => {register, Key, Ref, Pid} | {unregister, Key, Ref}
    pending = #{} :: #{reference() => tuple()},
    %% Key => {register, NifRef, [From]} | {unregister, NifRef, [From], [{From, Opts, Pid}]}
    busy = #{} :: #{key() => tuple()},
    %% Ref => Key, while its unregister is in flight
    unregistering = #{} :: #{reference() => key()},
    %% MonRef => Ref
    monitors = #{} :: #{reference() => reference()}
}).

%% ---- API -----------------------------------------------------------------

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec register_worker(binary(), binary(), map(), pid()) -> reference() | {error, term()}.
register_worker(Type, Id, Opts, Pid) ->
    case call({register, Type, Id, Opts, Pid}) of
        {error, {server_down, _}} ->
            %% The server crashed with the request in flight: its answer
            %% (a registration) went with it and is garbage, which
            %% removes that worker; the restarted server registers anew.
            couch_workers_app:call_successor(?MODULE, {register, Type, Id, Opts, Pid});
        Result ->
            Result
    end.

-spec unregister_worker(term()) -> ok | {error, timeout}.
unregister_worker(Ref) ->
    case call({unregister, Ref}) of
        ok -> ok;
        {error, Reason} when Reason =/= timeout -> ok;
        {error, timeout} = Error -> Error
    end.

%% @doc The `(Type, Id)' of the worker registered on this node as `Ref'
%% (a direct ETS read); `error' for an unknown or stale `Ref'.
-spec lookup(term()) -> {ok, binary(), binary()} | error.
lookup(Ref) when is_reference(Ref) ->
    try ets:lookup(?TAB, Ref) of
        [{Ref, Type, Id, _Pid, _Reg, _Mon}] -> {ok, Type, Id};
        [] -> error
    catch
        error:badarg -> error
    end;
lookup(_Ref) ->
    error.

%% @doc As `lookup/1', with the NIF's registration resource: what an
%% accept names so that it takes jobs for this registration only, never
%% for a later one of the same `(Type, Id)'.
-spec registration(term()) -> {ok, binary(), binary(), couch_workers_nif:registration()} | error.
registration(Ref) when is_reference(Ref) ->
    try ets:lookup(?TAB, Ref) of
        [{Ref, Type, Id, _Pid, Reg, _Mon}] -> {ok, Type, Id, Reg};
        [] -> error
    catch
        error:badarg -> error
    end;
registration(_Ref) ->
    error.

call(Msg) ->
    couch_workers_app:call(?MODULE, Msg).

%% ---- gen_server ----------------------------------------------------------

-spec init([]) -> {ok, #st{}}.
init([]) ->
    process_flag(trap_exit, true),
    {ok, restore(#st{})}.

-spec handle_call(term(), gen_server:from(), #st{}) ->
    {reply, term(), #st{}} | {noreply, #st{}}.
handle_call({register, Type, Id, Opts, Pid}, From, St) ->
    {noreply, do_register({Type, Id}, Opts, Pid, From, St)};
handle_call({unregister, Ref}, From, St) ->
    case ets:lookup(?TAB, Ref) of
        [{Ref, Type, Id, _Pid, Reg, Mon}] ->
            erlang:demonitor(Mon, [flush]),
            St1 = St#st{monitors = maps:remove(Mon, St#st.monitors)},
            {noreply, start_unregister({Type, Id}, Ref, Reg, unregister, [From], St1)};
        [] ->
            case maps:find(Ref, St#st.unregistering) of
                {ok, Key} ->
                    %% Already on its way out: answer when it is written.
                    {unregister, N, Froms, Queue} = maps:get(Key, St#st.busy),
                    Busy = maps:put(Key, {unregister, N, [From | Froms], Queue}, St#st.busy),
                    {noreply, St#st{busy = Busy}};
                error ->
                    {reply, ok, St}
            end
    end;
handle_call(Msg, _From, St) ->
    couch_workers_server:unknown_call(?MODULE, Msg, St).

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(Msg, St) ->
    couch_workers_server:unknown_cast(?MODULE, Msg, St).

-spec handle_info(term(), #st{}) -> {noreply, #st{}}.
handle_info({NifRef, Result}, St) when is_reference(NifRef) ->
    case maps:take(NifRef, St#st.pending) of
        {Op, Pending} ->
            {noreply, nif_result(Op, Result, St#st{pending = Pending})};
        error ->
            %% A reply for a request this server no longer knows (it was
            %% restarted, or the request was abandoned): a registration in
            %% it is garbage collected, which removes the worker.
            ?LOG_NOTICE(#{what => unexpected_nif_reply, server => ?MODULE, result => Result}),
            {noreply, St}
    end;
handle_info({couch_workers_worker_superseded, Ref}, St) ->
    {noreply, forget(Ref, St)};
handle_info({couch_workers_worker_reaped, Ref} = Msg, St) ->
    %% For an owner on another node (the NIF sends to local pids only).
    {noreply, forward(Ref, Msg, St)};
handle_info({couch_workers_worker_lost, Ref, _Reason} = Msg, St) ->
    {noreply, forward(Ref, Msg, St)};
handle_info({couch_workers_worker_at_risk, Ref, _Reason} = Msg, St) ->
    {noreply, forward(Ref, Msg, St)};
handle_info({couch_workers_job_timeout, Ref, _Type, _Id} = Msg, St) ->
    {noreply, forward(Ref, Msg, St)};
handle_info({'DOWN', Mon, process, Pid, Reason}, St) ->
    case maps:take(Mon, St#st.monitors) of
        {Ref, Monitors} ->
            St1 = St#st{monitors = Monitors},
            case ets:lookup(?TAB, Ref) of
                [{Ref, Type, Id, Pid, Reg, Mon}] ->
                    %% Whatever the reason (`normal' too; `noproc' when
                    %% the owner died while this server was down;
                    %% `noconnection' for a remote owner whose node is
                    %% gone): the owner did not unregister, so the worker
                    %% died, and its running jobs fail with `worker_lost'.
                    ?LOG_DEBUG(#{what => worker_owner_down, type => Type, id => Id, pid => Pid, reason => Reason}),
                    {noreply, start_unregister({Type, Id}, Ref, Reg, death, [], St1)};
                _ ->
                    {noreply, St1}
            end;
        error ->
            {noreply, St}
    end;
handle_info({'EXIT', _Pid, _Reason}, St) ->
    %% Trapped only so that terminate/2 runs on shutdown; the parent's
    %% EXIT is handled by gen_server itself.
    {noreply, St};
handle_info(Msg, St) ->
    couch_workers_server:unknown_info(?MODULE, Msg, St).

-spec terminate(term(), #st{}) -> ok.
terminate(Reason, St) when
    Reason =:= shutdown; Reason =:= normal; is_tuple(Reason), element(1, Reason) =:= shutdown
->
    %% Unregister every worker before the node stops, and wait for the
    %% writes (and for unregisters already in flight).
    Regs = ets:select(?TAB, [{{'$1', '_', '_', '$2', '$3', '_'}, [{is_reference, '$1'}], [{{'$1', '$2', '$3'}}]}]),
    NifRefs = lists:foldl(
        fun({_Ref, _Pid, Reg}, Acc) ->
            NifRef = make_ref(),
            case couch_workers_nif:worker_unregister(NifRef, Reg) of
                ok -> [NifRef | Acc];
                {error, _} -> Acc
            end
        end,
        [N || {N, {unregister, _, _}} <- maps:to_list(St#st.pending)],
        Regs
    ),
    Deadline = erlang:monotonic_time(millisecond) + ?TERMINATE_WAIT_MS,
    Left = wait_all(NifRefs, Deadline),
    %% The registrations are over, without their owners' doing.
    [lost(Pid, Ref) || {Ref, Pid, _Reg} <- Regs],
    %% Nothing left to restore: a server started after this one (a
    %% restart of this child alone) must not take these over.
    true = ets:delete_all_objects(?TAB),
    ?LOG_INFO(#{
        what => couch_workers_local_stopped,
        reason => Reason,
        unregistered => length(Regs),
        unanswered => length(Left)
    }),
    ok;
terminate(_Crash, _St) ->
    %% A crash: the registrations stay in the table, for the restarted
    %% server to restore.
    ok.

%% ---- internal ------------------------------------------------------------

%% Takes over the registrations a crashed predecessor left in the table,
%% when they were made on the running node.
restore(St) ->
    case couch_workers_node:claim(?TAB) of
        current -> ok;
        gone -> drop_node_gone()
    end,
    Regs = ets:select(?TAB, [{{'$1', '_', '_', '_', '_', '_'}, [{is_reference, '$1'}], ['$_']}]),
    St1 = lists:foldl(
        fun({Ref, Type, Id, Pid, Reg, _OldMon}, S) ->
            ok = notify(Reg, Pid, Ref),
            Mon = erlang:monitor(process, Pid),
            true = ets:insert(?TAB, {Ref, Type, Id, Pid, Reg, Mon}),
            S#st{monitors = maps:put(Mon, Ref, S#st.monitors)}
        end,
        St,
        Regs
    ),
    %% A key whose registration row is gone (the crash came between the
    %% two deletes of an unregister).
    Orphans = [
        Row
     || {{_, _}, Ref} = Row <- ets:select(?TAB, [{{{'_', '_'}, '_'}, [], ['$_']}]), ets:lookup(?TAB, Ref) =:= []
    ],
    [ets:delete_object(?TAB, Row) || Row <- Orphans],
    case Regs of
        [] -> ok;
        _ -> ?LOG_NOTICE(#{what => couch_workers_local_restored, registrations => length(Regs)})
    end,
    St1.

%% The rows a crashed predecessor left of a node that is gone: their
%% handles are void (nothing heartbeats them, nothing can unregister them
%% now), so their owners are told, and the rows dropped.
drop_node_gone() ->
    Regs = ets:select(?TAB, [{{'$1', '_', '_', '$2', '_', '_'}, [{is_reference, '$1'}], [{{'$1', '$2'}}]}]),
    [lost(Pid, Ref) || {Ref, Pid} <- Regs],
    true = ets:delete_all_objects(?TAB),
    case Regs of
        [] -> ok;
        _ -> ?LOG_WARNING(#{what => couch_workers_local_node_gone, registrations => length(Regs)})
    end.

lost(Pid, Ref) ->
    Pid ! {couch_workers_worker_lost, Ref, stopped},
    ok.

%% Owner events go to the owner itself; to this server, which forwards
%% them, for an owner on another node.
notify(Reg, Pid, Ref) when node(Pid) =:= node() ->
    couch_workers_nif:worker_notify(Reg, Pid, Ref);
notify(Reg, _RemotePid, Ref) ->
    couch_workers_nif:worker_notify(Reg, self(), Ref).

forward(Ref, Msg, St) ->
    case ets:lookup(?TAB, Ref) of
        [{Ref, _Type, _Id, Pid, _Reg, _Mon}] ->
            Pid ! Msg,
            ok;
        [] ->
            ok
    end,
    St.

%% Drops a registration another one replaced: its owner was told.
forget(Ref, St) ->
    case ets:lookup(?TAB, Ref) of
        [{Ref, Type, Id, _Pid, _Reg, Mon}] ->
            erlang:demonitor(Mon, [flush]),
            ets:delete(?TAB, Ref),
            ets:delete_object(?TAB, {{Type, Id}, Ref}),
            ?LOG_DEBUG(#{what => worker_forgotten, type => short(Type), id => short(Id), reason => superseded}),
            St#st{monitors = maps:remove(Mon, St#st.monitors)};
        [] ->
            St
    end.

do_register(Key, Opts, Pid, From, St) ->
    case ets:lookup(?TAB, Key) of
        [{Key, Ref}] ->
            gen_server:reply(From, Ref),
            St;
        [] ->
            case maps:find(Key, St#st.busy) of
                {ok, {register, N, Froms}} ->
                    St#st{busy = maps:put(Key, {register, N, [From | Froms]}, St#st.busy)};
                {ok, {unregister, N, Froms, Queue}} ->
                    Busy = maps:put(Key, {unregister, N, Froms, Queue ++ [{From, Opts, Pid}]}, St#st.busy),
                    St#st{busy = Busy};
                error ->
                    start_register(Key, Opts, Pid, From, St)
            end
    end.

start_register({Type, Id} = Key, Opts, Pid, From, St) ->
    NifRef = make_ref(),
    try couch_workers_nif:budgeted(worker_register, [NifRef, Type, Id, Opts]) of
        ok ->
            Ref = make_ref(),
            St#st{
                pending = maps:put(NifRef, {register, Key, Ref, Pid}, St#st.pending),
                busy = maps:put(Key, {register, NifRef, [From]}, St#st.busy)
            };
        {error, _} = Error ->
            gen_server:reply(From, Error),
            St
    catch
        error:badarg ->
            gen_server:reply(From, {error, badarg}),
            St
    end.

%% Removes the registration. `unregister' (a `worker_unregister/1')
%% releases its running jobs; `death' (its owner exited) fails them: a
%% clean shutdown never fails a job, a death spends the attempt.
start_unregister(Key, Ref, Reg, How, Froms, St) ->
    ets:delete(?TAB, Ref),
    ets:delete(?TAB, Key),
    NifRef = make_ref(),
    case remove(How, NifRef, Reg) of
        ok ->
            St#st{
                pending = maps:put(NifRef, {unregister, Key, Ref}, St#st.pending),
                busy = maps:put(Key, {unregister, NifRef, Froms, []}, St#st.busy),
                unregistering = maps:put(Ref, Key, St#st.unregistering)
            };
        {error, Reason} ->
            %% The node is not running: nothing of the worker is left here.
            ?LOG_DEBUG(#{what => worker_unregister_skipped, key => Key, reason => Reason}),
            [gen_server:reply(F, ok) || F <- Froms],
            St
    end.

remove(unregister, NifRef, Reg) -> couch_workers_nif:worker_unregister(NifRef, Reg);
remove(death, NifRef, Reg) -> couch_workers_nif:worker_remove_dead(NifRef, Reg).

nif_result({register, {Type, Id} = Key, Ref, Pid}, Result, St) ->
    {register, _, Froms} = maps:get(Key, St#st.busy),
    St1 = St#st{busy = maps:remove(Key, St#st.busy)},
    case Result of
        {ok, Reg} ->
            Mon = erlang:monitor(process, Pid),
            true = ets:insert(?TAB, [{Key, Ref}, {Ref, Type, Id, Pid, Reg, Mon}]),
            ok = notify(Reg, Pid, Ref),
            ?LOG_DEBUG(#{what => worker_registered, type => Type, id => Id, pid => Pid}),
            couch_workers_observe:worker(registered, Type, Id),
            [gen_server:reply(F, Ref) || F <- Froms],
            St1#st{monitors = maps:put(Mon, Ref, St1#st.monitors)};
        {error, Reason} = Error ->
            ?LOG_DEBUG(#{what => worker_register_failed, type => short(Type), id => short(Id), reason => Reason}),
            [gen_server:reply(F, Error) || F <- Froms],
            St1;
        Other ->
            ?LOG_ERROR(#{what => worker_register_bad_reply, type => short(Type), id => short(Id), reply => Other}),
            [gen_server:reply(F, {error, Other}) || F <- Froms],
            St1
    end;
nif_result({unregister, {Type, Id} = Key, Ref}, Result, St) ->
    {unregister, _, Froms, Queue} = maps:get(Key, St#st.busy),
    case Result of
        ok ->
            ?LOG_DEBUG(#{what => worker_unregistered, type => Type, id => Id}),
            couch_workers_observe:worker(unregistered, Type, Id);
        _ -> ?LOG_WARNING(#{what => worker_unregister_failed, type => Type, id => Id, reason => Result})
    end,
    [gen_server:reply(F, ok) || F <- Froms],
    St1 = St#st{
        busy = maps:remove(Key, St#st.busy),
        unregistering = maps:remove(Ref, St#st.unregistering)
    },
    %% Registers that waited for this unregister, in order.
    lists:foldl(fun({From, Opts, Pid}, S) -> do_register(Key, Opts, Pid, From, S) end, St1, Queue).

%% Ids and types in log events, cut to a readable length (keys may be
%% 10,000 bytes).
short(<<Head:64/binary, _, _/binary>>) -> <<Head/binary, "...">>;
short(Bin) -> Bin.

wait_all([], _Deadline) ->
    [];
wait_all(NifRefs, Deadline) ->
    Timeout = max(0, Deadline - erlang:monotonic_time(millisecond)),
    receive
        {NifRef, _} when is_reference(NifRef) ->
            wait_all(lists:delete(NifRef, NifRefs), Deadline)
    after Timeout ->
        NifRefs
    end.
