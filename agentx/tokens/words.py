"""The code-like vocabulary synthetic prompt blocks are written in.

Plain lowercase ASCII words: identifiers, keywords and English that occur in coding sessions.
They are one token each for the built-in tokenizer, and the common ones are one token for
byte-level BPE tokenizers too (HF mode re-selects the single-token subset for its tokenizer).
"""
from __future__ import annotations

WORDS: tuple[str, ...] = tuple("""
def return self class import from if else elif for while in is not and or none true false
with as try except finally raise assert lambda yield async await pass break continue global
int str float bool list dict set tuple bytes object type len range print open file path
value values key keys item items index count size length name names data result results
error errors message config options args kwargs params param request response client server
session token tokens cache block blocks hash buffer stream chunk chunks batch queue worker
thread process task tasks event loop timer time timeout delay start stop run main test tests
check assert expected actual input output source target model layer layers weight weights
shape tensor array matrix vector row rows column columns table field fields record records
user users admin group role permission access read write update delete create insert select
query where order limit offset page total sum mean max min sort filter map reduce parse load
save dump json yaml text line lines word words string format template render view state
store get put post patch head url host port address socket connect close send recv handle
handler callback hook plugin module package import version build deploy release branch
commit merge diff patch review issue fix bug feature change changes refactor rename move copy
the a an of to and in that it for on with as was at by this be are from or have not but
which one all we can there their if will each about how up out them then she many some so
these would other into has more her two like him see time could no make than first been its
who now people my made over did down only way find use may water long little very after
called just where most know get through back much before go good new write our used me man
too any day same right look think also around another came come work three word must because
does part even place well such here take why help put different away again off went old
number great tell men say small every found still between name should home big give air line
set own under read last never us left end along while might next sound below saw something
thought both few those always looks show large often together asked house world going want
school important until form food keep children feet land side without boy once animals life
enough took four head above kind began almost live page got earth need far hand high year
mother light country father let night picture being study second soon story since white ever
paper hard near sentence better best across during today however sure knew try told young sun
function method variable constant parameter argument default optional required missing
invalid valid empty null undefined exception warning debug info trace log logger logging
status code body header headers content length encoding decode encode serialize schema
database connection transaction cursor commit rollback migration index primary foreign
unique constraint integer boolean decimal timestamp interval local remote global private
public static final abstract interface implements extends override super this new delete
virtual const struct enum union typedef namespace template include define ifdef endif pragma
""".split())
