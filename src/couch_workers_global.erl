%% @doc Membership subscriptions of this node.
%%
%% Keeps the ETS tables `couch_workers_membership' (`{Type, VS, Workers}',
%% read directly by `couch_workers:get_workers/1') and
%% `couch_workers_membership_subs' (`{Ref, Type, Pid, Module, SeenVS}':
%% every subscription, and the versionstamp of the last delivery it took),
%% both owned by the supervisor (`couch_workers_tables'). They outlive a
%% crash of this server: the restarted server restores every
%% subscription (owner monitor, callback process, a new watcher per type)
%% and delivers the current membership to each whose `SeenVS' is older, so
%% no subscription ends silently; one whose watcher cannot be started
%% again gets `{couch_workers_membership_ended, Ref, Reason}'.
%% One NIF watcher runs per worker type that has subscribers on this node:
%% started by the type's first subscription, stopped by its last
%% unsubscribe (and then the type's ETS entry goes). The watcher sends
%% here, with a fresh `Tag' per watcher so that a late message of a stopped
%% watcher is recognized and dropped, first the whole membership
%% (`{couch_workers_membership_changed, Tag, Type, VS, Workers}') and then
%% mostly only the changes (`{couch_workers_membership_delta, Tag, Type,
%% VS, Joined, Left}', see couch_workers_nif). This server keeps each
%% type's current map, applies the changes to it (work per change, not per
%% member), puts it in ETS and fans it out.
%%
%% The API delivers the whole `Workers' map, so the ETS insert and the
%% message to each subscriber still copy the whole map on every change
%% (about 1 and 2 ms at 10,000 members): that much of a change's cost stays
%% in proportion to the membership.
%%
%% Deliveries to one subscription carry strictly increasing versionstamps
%% and none is repeated. A new subscription gets the current membership at
%% once when the type's watcher has delivered it already (the map kept
%% here), else
%% with the watcher's first delivery.
%%
%% With `Module = nil' a delivery is the message
%% `{couch_workers_membership, Type, Workers, VS, Ref}' to the owner; with
%% a module it is a call of `Module:couch_workers_membership_update/4' in
%% a process of the subscription's own, so a slow or crashing callback
%% harms nobody (crashes are caught and logged). The owner is monitored:
%% its exit ends the subscription.
-module(couch_workers_global).

-behaviour(gen_server).

-export([start_link/0, subscribe/3, unsubscribe/1, get_workers/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-define(TAB, couch_workers_membership).
-define(SUBS, couch_workers_membership_subs).

-record(sub, {
    ref :: reference(),
    type :: binary(),
    pid :: pid(),
    mon :: reference(),
    module :: nil | module(),
    %% the callback process (module subscriptions only)
    proc :: undefined | pid(),
    %% versionstamp of the last delivery
    last_vs = undefined :: undefined | binary()
}).

-record(watch, {
    tag :: reference(),
    res :: reference(),
    subs = #{} :: #{reference() => true},
    %% the membership as last delivered (undefined until the watcher's
    %% first message): the map the next delta applies to
    vs = undefined :: undefined | binary(),
    workers = undefined :: undefined | map()
}).

-record(st, {
    subs = #{} :: #{reference() => #sub{}},
    watches = #{} :: #{binary() => #watch{}},
    %% owner monitor => subscription ref
    mons = #{} :: #{reference() => reference()},
    %% callback process => subscription ref
    procs = #{} :: #{pid() => reference()}
}).

%% ---- API -----------------------------------------------------------------

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec subscribe(binary(), nil | module(), pid()) -> reference() | {error, term()}.
subscribe(Type, Module, Pid) ->
    call({subscribe, Type, Module, Pid}).

%% @doc Returns only once this server has ended the subscription (it is
%% the one that sends deliveries): however long it takes to answer, and
%% from its successor if it crashes meanwhile.
-spec unsubscribe(term()) -> ok.
unsubscribe(Ref) ->
    _ = couch_workers_app:call_answered(?MODULE, {unsubscribe, Ref}),
    ok.

-spec get_workers(binary()) -> {ok, binary(), map()} | {error, not_found}.
get_workers(Type) ->
    try ets:lookup(?TAB, Type) of
        [{Type, VS, Workers}] -> {ok, VS, Workers};
        [] -> {error, not_found}
    catch
        error:badarg -> {error, not_found}
    end.

call(Msg) ->
    couch_workers_app:call(?MODULE, Msg).

%% ---- gen_server ----------------------------------------------------------

-spec init([]) -> {ok, #st{}}.
init([]) ->
    process_flag(trap_exit, true),
    {ok, restore(#st{})}.

-spec handle_call(term(), gen_server:from(), #st{}) -> {reply, term(), #st{}}.
handle_call({subscribe, Type, Module, Pid}, _From, St) ->
    case ensure_watch(Type, St) of
        {ok, St1} ->
            Ref = make_ref(),
            Mon = erlang:monitor(process, Pid),
            Proc = start_proc(Module),
            Sub0 = #sub{ref = Ref, type = Type, pid = Pid, mon = Mon, module = Module, proc = Proc},
            true = ets:insert(?SUBS, {Ref, Type, Pid, Module, undefined}),
            #watch{subs = Subs, vs = VS, workers = Workers} = W = maps:get(Type, St1#st.watches),
            Sub =
                case VS of
                    undefined -> Sub0;
                    _ -> deliver(Sub0, VS, Workers)
                end,
            St2 = St1#st{
                subs = maps:put(Ref, Sub, St1#st.subs),
                watches = maps:put(Type, W#watch{subs = maps:put(Ref, true, Subs)}, St1#st.watches),
                mons = maps:put(Mon, Ref, St1#st.mons),
                procs = add_proc(Proc, Ref, St1#st.procs)
            },
            ?LOG_DEBUG(#{what => membership_subscribed, type => Type, module => Module, pid => Pid}),
            {reply, Ref, St2};
        {error, _} = Error ->
            {reply, Error, St}
    end;
handle_call({unsubscribe, Ref}, {Caller, _}, St) ->
    case maps:find(Ref, St#st.subs) of
        {ok, Sub} ->
            ?LOG_DEBUG(#{what => membership_unsubscribed, type => Sub#sub.type, ref => Ref}),
            {reply, ok, remove_sub(Sub, Caller, St)};
        error ->
            {reply, ok, St}
    end;
handle_call(Msg, _From, St) ->
    couch_workers_server:unknown_call(?MODULE, Msg, St).

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(Msg, St) ->
    couch_workers_server:unknown_cast(?MODULE, Msg, St).

-spec handle_info(term(), #st{}) -> {noreply, #st{}}.
handle_info({couch_workers_membership_changed, Tag, Type, VS, Workers}, St) ->
    {noreply, membership_changed(Tag, Type, VS, {whole, Workers}, St)};
handle_info({couch_workers_membership_delta, Tag, Type, VS, Joined, Left}, St) ->
    {noreply, membership_changed(Tag, Type, VS, {delta, Joined, Left}, St)};
handle_info({'DOWN', Mon, process, _Pid, _Reason}, St) ->
    case maps:find(Mon, St#st.mons) of
        {ok, Ref} ->
            #sub{} = Sub = maps:get(Ref, St#st.subs),
            ?LOG_DEBUG(#{what => membership_owner_down, type => Sub#sub.type, ref => Ref}),
            {noreply, remove_sub(Sub, none, St)};
        error ->
            {noreply, St}
    end;
handle_info({'EXIT', Proc, Reason}, St) ->
    case maps:take(Proc, St#st.procs) of
        {Ref, Procs} ->
            %% The callback process died although it catches every crash
            %% of the callback (someone killed it): the subscription goes
            %% on with a new one.
            #sub{module = Module} = Sub = maps:get(Ref, St#st.subs),
            ?LOG_WARNING(#{what => membership_callback_process_died, module => Module, reason => Reason}),
            New = start_proc(Module),
            {noreply, St#st{
                subs = maps:put(Ref, Sub#sub{proc = New}, St#st.subs),
                procs = maps:put(New, Ref, Procs)
            }};
        error ->
            {noreply, St}
    end;
handle_info(Msg, St) ->
    couch_workers_server:unknown_info(?MODULE, Msg, St).

-spec terminate(term(), #st{}) -> ok.
terminate(_Reason, St) ->
    maps:foreach(fun(_Type, #watch{res = Res}) -> couch_workers_nif:membership_unwatch(Res) end, St#st.watches),
    ok.

%% ---- internal ------------------------------------------------------------

%% Takes over the subscriptions a crashed predecessor left in the tables:
%% each gets a monitor, its callback process and, per type, a new watcher
%% (the old ones stopped when their handles went with the old server),
%% which starts from the cached membership; a subscription that has not
%% seen it yet gets it now, one whose owner died meanwhile ends on its
%% `DOWN'.
restore(St) ->
    Rows = ets:tab2list(?SUBS),
    Cached = maps:from_list([{Type, {VS, Workers}} || {Type, VS, Workers} <- ets:tab2list(?TAB)]),
    St1 = lists:foldl(fun(Row, S) -> restore_sub(Row, Cached, S) end, St, Rows),
    %% Cache entries of types nobody subscribes to any more.
    [ets:delete(?TAB, Type) || Type <- maps:keys(Cached), not maps:is_key(Type, St1#st.watches)],
    case Rows of
        [] -> ok;
        _ -> ?LOG_NOTICE(#{what => couch_workers_global_restored, subscriptions => length(Rows)})
    end,
    St1.

restore_sub({Ref, Type, Pid, Module, SeenVS}, Cached, St) ->
    case ensure_watch(Type, St) of
        {ok, St1} ->
            W0 = maps:get(Type, St1#st.watches),
            W =
                case {W0#watch.vs, maps:find(Type, Cached)} of
                    {undefined, {ok, {CachedVS, CachedWorkers}}} -> W0#watch{vs = CachedVS, workers = CachedWorkers};
                    _ -> W0
                end,
            Mon = erlang:monitor(process, Pid),
            Proc = start_proc(Module),
            Sub0 = #sub{ref = Ref, type = Type, pid = Pid, mon = Mon, module = Module, proc = Proc, last_vs = SeenVS},
            Sub =
                case W#watch.vs of
                    undefined -> Sub0;
                    WatchVS -> deliver(Sub0, WatchVS, W#watch.workers)
                end,
            St1#st{
                subs = maps:put(Ref, Sub, St1#st.subs),
                watches = maps:put(Type, W#watch{subs = maps:put(Ref, true, W#watch.subs)}, St1#st.watches),
                mons = maps:put(Mon, Ref, St1#st.mons),
                procs = add_proc(Proc, Ref, St1#st.procs)
            };
        {error, Reason} ->
            ?LOG_WARNING(#{what => membership_subscription_ended, type => Type, reason => Reason}),
            Pid ! {couch_workers_membership_ended, Ref, Reason},
            ets:delete(?SUBS, Ref),
            St
    end.

ensure_watch(Type, St) ->
    case maps:is_key(Type, St#st.watches) of
        true ->
            {ok, St};
        false ->
            Tag = make_ref(),
            case couch_workers_nif:membership_watch(Type, Tag) of
                {ok, Res} ->
                    ?LOG_DEBUG(#{what => membership_watch_started, type => Type}),
                    W = #watch{tag = Tag, res = Res},
                    {ok, St#st{watches = maps:put(Type, W, St#st.watches)}};
                {error, _} = Error ->
                    Error
            end
    end.

membership_changed(Tag, Type, VS, Change, St) ->
    case maps:find(Type, St#st.watches) of
        {ok, #watch{tag = Tag, subs = Refs, workers = Old} = W} ->
            %% One watcher's messages come in order, each with a greater
            %% versionstamp, the first one whole: every delta applies to
            %% the map of the message before.
            Workers = apply_change(Change, Old),
            true = ets:insert(?TAB, {Type, VS, Workers}),
            Subs = maps:fold(
                fun(Ref, true, Acc) -> maps:update_with(Ref, fun(S) -> deliver(S, VS, Workers) end, Acc) end,
                St#st.subs,
                Refs
            ),
            St#st{subs = Subs, watches = maps:put(Type, W#watch{vs = VS, workers = Workers}, St#st.watches)};
        _ ->
            %% From a watcher stopped since (the message was on its way).
            ?LOG_DEBUG(#{what => stale_membership_message, type => Type}),
            St
    end.

apply_change({whole, Workers}, _Old) ->
    Workers;
apply_change({delta, Joined, Left}, Old) ->
    Kept = lists:foldl(fun maps:remove/2, Old, Left),
    lists:foldl(fun({Id, Opts}, Acc) -> maps:put(Id, Opts, Acc) end, Kept, Joined).

%% Delivers unless the subscription has seen this versionstamp or a later one.
deliver(#sub{last_vs = Last} = Sub, VS, _Workers) when Last =/= undefined, VS =< Last ->
    Sub;
deliver(#sub{ref = Ref, type = Type, module = nil, pid = Pid} = Sub, VS, Workers) ->
    Pid ! {couch_workers_membership, Type, Workers, VS, Ref},
    seen(Ref, VS),
    Sub#sub{last_vs = VS};
deliver(#sub{ref = Ref, type = Type, proc = Proc} = Sub, VS, Workers) ->
    Proc ! {couch_workers_deliver, Type, Workers, VS, Ref},
    Sub#sub{last_vs = VS}.

%% Records the last delivery a subscription took, for a restarted server
%% (a row already gone, or the table with the app, needs nothing).
seen(Ref, VS) ->
    try ets:update_element(?SUBS, Ref, {5, VS}) of
        _ -> ok
    catch
        error:badarg -> ok
    end.

remove_sub(#sub{ref = Ref, type = Type, mon = Mon, proc = Proc}, Caller, St) ->
    erlang:demonitor(Mon, [flush]),
    stop_proc(Proc, Caller),
    ets:delete(?SUBS, Ref),
    St1 = St#st{
        subs = maps:remove(Ref, St#st.subs),
        mons = maps:remove(Mon, St#st.mons),
        procs = maps:remove(Proc, St#st.procs)
    },
    #watch{res = Res, subs = Refs0} = W = maps:get(Type, St1#st.watches),
    Refs = maps:remove(Ref, Refs0),
    case map_size(Refs) of
        0 ->
            ok = couch_workers_nif:membership_unwatch(Res),
            ets:delete(?TAB, Type),
            ?LOG_DEBUG(#{what => membership_watch_stopped, type => Type}),
            St1#st{watches = maps:remove(Type, St1#st.watches)};
        _ ->
            St1#st{watches = maps:put(Type, W#watch{subs = Refs}, St1#st.watches)}
    end.

add_proc(undefined, _Ref, Procs) -> Procs;
add_proc(Proc, Ref, Procs) -> maps:put(Proc, Ref, Procs).

%% ---- callback processes --------------------------------------------------

start_proc(nil) ->
    undefined;
start_proc(Module) ->
    spawn_link(fun() -> callback_loop(Module) end).

%% Stops a callback process so that no delivery runs after the caller's
%% unsubscribe returns. The process itself may be the caller (a callback
%% that unsubscribes): it is told to stop before its next delivery.
stop_proc(undefined, _Caller) ->
    ok;
stop_proc(Proc, Proc) ->
    unlink(Proc),
    Proc ! couch_workers_stop,
    ok;
stop_proc(Proc, _Caller) ->
    MRef = erlang:monitor(process, Proc),
    unlink(Proc),
    exit(Proc, kill),
    receive
        {'DOWN', MRef, process, Proc, _} -> ok
    end.

callback_loop(Module) ->
    receive
        {couch_workers_deliver, Type, Workers, VS, Ref} ->
            receive
                couch_workers_stop -> exit(normal)
            after 0 -> ok
            end,
            %% Taken (before the call: a callback killed halfway is not
            %% called again with the same membership).
            seen(Ref, VS),
            try
                Module:couch_workers_membership_update(Type, Workers, VS, Ref)
            catch
                Class:Reason:Stack ->
                    ?LOG_ERROR(#{
                        what => membership_callback_crashed,
                        module => Module,
                        type => Type,
                        class => Class,
                        reason => Reason,
                        stacktrace => Stack
                    })
            end,
            callback_loop(Module);
        couch_workers_stop ->
            ok
    end.
