%% @doc The server that owns the job subscriptions of this node (as
%% couch_jobs keeps `couch_jobs_notifier' apart from `couch_jobs').
%%
%% The NIF sends `{couch_workers_job, Ref, Job}' (and finally
%% `{couch_workers_job, Ref, removed}') straight to the subscriber. This
%% server keeps each subscription's NIF handle and monitors the
%% subscriber, so that an exit ends its subscriptions; after `removed' the
%% NIF tells the process registered as this server, looked up at the time
%% it sends, `{couch_workers_job_ended, Ref}'.
%%
%% The handles live in the supervisor's table `couch_workers_jobs_subs'
%% (`couch_workers_tables'), one row `{SubRef, Pid, Handle}' each: a crash
%% of this server keeps them alive, and its restart monitors every
%% subscriber again, so deliveries go on and `unsubscribe/1' still works.
%% Lost in a crash, and only that: subscribes in flight (their callers get
%% `{error, {server_down, _}}' and the handle in the late reply is garbage
%% collected), and an end the NIF reported while no server was registered
%% (that row is dropped when its subscriber unsubscribes or exits).
%%
%% A subscription belongs to the node it was made on (a new
%% `couch_workers_node' owner is a new node). A stop of this server (the
%% application stops, or its group restarts after the node's owner died)
%% ends every subscription and tells each subscriber
%% `{couch_workers_job_subscription_ended, Ref, stopped}', after which
%% nothing of `Ref' comes; a restarted server that finds subscriptions of
%% a node that is gone tells theirs the same.
-module(couch_workers_jobs_subs).

-behaviour(gen_server).

-export([subscribe/3, unsubscribe/1]).
-export([start_link/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-define(TAB, couch_workers_jobs_subs).

-record(st, {
    %% monitor => subscription ref (the rows themselves are in ?TAB)
    mons = #{} :: #{reference() => reference()},
    %% subscription ref => monitor
    subs = #{} :: #{reference() => reference()},
    %% NIF ref => {From, subscription ref, Pid}, while a subscribe is in flight
    pending = #{} :: #{reference() => {gen_server:from(), reference(), pid()}},
    %% subscriptions that ended (job removed) before their subscribe was answered
    ended = #{} :: #{reference() => true}
}).

%% ---- API --------------------------------------------------------------------

%% A subscription of `Pid' (a local process) to one job's changes.
-spec subscribe(binary(), binary(), pid()) -> {ok, reference(), map()} | {error, term()}.
subscribe(Type, Id, Pid) when is_binary(Type), is_binary(Id), is_pid(Pid), node(Pid) =:= node() ->
    case couch_workers_app:call(?MODULE, {subscribe, Type, Id, Pid}) of
        {error, badarg} -> erlang:error(badarg);
        Result -> Result
    end;
subscribe(_Type, _Id, _Pid) ->
    erlang:error(badarg).

%% Returns once nothing more of `Ref' can arrive, and flushes what did.
-spec unsubscribe(term()) -> ok.
unsubscribe(Ref) when is_reference(Ref) ->
    _ = couch_workers_app:call_answered(?MODULE, {unsubscribe, Ref}),
    flush(Ref);
unsubscribe(_Ref) ->
    ok.

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% ---- gen_server -------------------------------------------------------------

-spec init([]) -> {ok, #st{}}.
init([]) ->
    process_flag(trap_exit, true),
    {ok, restore(#st{})}.

-spec handle_call(term(), gen_server:from(), #st{}) -> {reply, term(), #st{}} | {noreply, #st{}}.
handle_call({subscribe, Type, Id, Pid}, From, St) ->
    NifRef = make_ref(),
    SubRef = make_ref(),
    try couch_workers_nif:job_subscribe(NifRef, Type, Id, Pid, SubRef) of
        ok ->
            {noreply, St#st{pending = maps:put(NifRef, {From, SubRef, Pid}, St#st.pending)}};
        {error, _} = Error ->
            {reply, Error, St}
    catch
        error:badarg -> {reply, {error, badarg}, St}
    end;
handle_call({unsubscribe, SubRef}, _From, St) ->
    case ets:lookup(?TAB, SubRef) of
        [{SubRef, _Pid, Res}] ->
            %% After this returns the NIF sends nothing more for SubRef.
            ok = couch_workers_nif:job_unsubscribe(Res),
            {reply, ok, drop_sub(SubRef, St)};
        [] ->
            {reply, ok, St}
    end;
handle_call(Msg, _From, St) ->
    ?LOG_WARNING(#{what => unknown_call, server => ?MODULE, msg => Msg}),
    {reply, {error, {bad_call, Msg}}, St}.

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(Msg, St) ->
    ?LOG_WARNING(#{what => unknown_cast, server => ?MODULE, msg => Msg}),
    {noreply, St}.

-spec handle_info(term(), #st{}) -> {noreply, #st{}}.
handle_info({NifRef, Result}, St) when is_reference(NifRef) ->
    case maps:take(NifRef, St#st.pending) of
        {{From, SubRef, Pid}, Pending} ->
            {noreply, subscribed(From, SubRef, Pid, Result, St#st{pending = Pending})};
        error ->
            %% A reply for a subscribe this server never made (one made by
            %% a crashed predecessor goes to that dead process): the handle
            %% in it is garbage collected, which ends that subscription.
            ?LOG_NOTICE(#{what => unexpected_nif_reply, server => ?MODULE}),
            {noreply, St}
    end;
handle_info({couch_workers_job_ended, SubRef}, St) ->
    case maps:is_key(SubRef, St#st.subs) of
        true ->
            {noreply, drop_sub(SubRef, St)};
        false ->
            InFlight = lists:any(fun({_, S, _}) -> S =:= SubRef end, maps:values(St#st.pending)),
            case InFlight of
                true -> {noreply, St#st{ended = maps:put(SubRef, true, St#st.ended)}};
                false -> {noreply, St}
            end
    end;
handle_info({'DOWN', Mon, process, _Pid, _Reason}, St) ->
    case maps:find(Mon, St#st.mons) of
        {ok, SubRef} ->
            case ets:lookup(?TAB, SubRef) of
                [{SubRef, _, Res}] -> ok = couch_workers_nif:job_unsubscribe(Res);
                [] -> ok
            end,
            {noreply, drop_sub(SubRef, St)};
        error ->
            {noreply, St}
    end;
handle_info({'EXIT', _Pid, _Reason}, St) ->
    %% Trapped only so that terminate/2 runs on shutdown.
    {noreply, St};
handle_info(Msg, St) ->
    ?LOG_WARNING(#{what => unknown_info, server => ?MODULE, msg => Msg}),
    {noreply, St}.

-spec terminate(term(), #st{}) -> ok.
terminate(Reason, _St) when
    Reason =:= shutdown; Reason =:= normal; is_tuple(Reason), element(1, Reason) =:= shutdown
->
    %% A stop: every subscription ends (its subscriber is told, after
    %% the last delivery), and nothing is left for a server started after
    %% this one to take over.
    [
        begin
            ok = couch_workers_nif:job_unsubscribe(Res),
            ended(Pid, SubRef)
        end
     || {SubRef, Pid, Res} <- ets:tab2list(?TAB)
    ],
    true = ets:delete_all_objects(?TAB),
    ok;
terminate(_Crash, _St) ->
    %% A crash: the subscriptions stay in the table, for the restarted
    %% server to restore.
    ok.

%% ---- internal ---------------------------------------------------------------

%% Takes over the subscriptions a crashed predecessor left in the table:
%% a subscriber that died meanwhile is reported `DOWN' at once.
restore(St) ->
    case couch_workers_node:claim(?TAB) of
        current -> ok;
        gone -> drop_node_gone()
    end,
    Rows = ets:tab2list(?TAB),
    St1 = lists:foldl(fun({SubRef, Pid, _Res}, S) -> monitored(SubRef, Pid, S) end, St, Rows),
    case Rows of
        [] -> ok;
        _ -> ?LOG_NOTICE(#{what => couch_workers_jobs_subs_restored, subscriptions => length(Rows)})
    end,
    St1.

%% Subscriptions a crashed predecessor left of a node that is gone: their
%% handles deliver nothing any more.
drop_node_gone() ->
    Rows = ets:tab2list(?TAB),
    [ended(Pid, SubRef) || {SubRef, Pid, _Res} <- Rows],
    true = ets:delete_all_objects(?TAB),
    case Rows of
        [] -> ok;
        _ -> ?LOG_WARNING(#{what => couch_workers_jobs_subs_node_gone, subscriptions => length(Rows)})
    end.

ended(Pid, SubRef) ->
    Pid ! {couch_workers_job_subscription_ended, SubRef, stopped},
    ok.

subscribed(From, SubRef, Pid, {ok, Res, Job}, St) ->
    gen_server:reply(From, {ok, SubRef, Job}),
    case maps:take(SubRef, St#st.ended) of
        {true, Ended} ->
            %% Removed already (Pid got `removed'): nothing to keep.
            St#st{ended = Ended};
        error ->
            true = ets:insert(?TAB, {SubRef, Pid, Res}),
            monitored(SubRef, Pid, St)
    end;
subscribed(From, SubRef, _Pid, {error, _} = Error, St) ->
    gen_server:reply(From, Error),
    St#st{ended = maps:remove(SubRef, St#st.ended)};
subscribed(From, SubRef, _Pid, Other, St) ->
    ?LOG_ERROR(#{what => job_subscribe_bad_reply, server => ?MODULE, reply => Other}),
    gen_server:reply(From, {error, Other}),
    St#st{ended = maps:remove(SubRef, St#st.ended)}.

monitored(SubRef, Pid, St) ->
    Mon = erlang:monitor(process, Pid),
    St#st{mons = maps:put(Mon, SubRef, St#st.mons), subs = maps:put(SubRef, Mon, St#st.subs)}.

drop_sub(SubRef, St) ->
    true = ets:delete(?TAB, SubRef),
    case maps:take(SubRef, St#st.subs) of
        {Mon, Subs} ->
            erlang:demonitor(Mon, [flush]),
            St#st{subs = Subs, mons = maps:remove(Mon, St#st.mons)};
        error ->
            St
    end.

flush(Ref) ->
    receive
        {couch_workers_job, Ref, _} -> flush(Ref)
    after 0 -> ok
    end.
